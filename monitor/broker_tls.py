"""The broker's TLS certificates: a CA of the deployment's own, and the broker's certificate it
signs for the names and addresses region workers use to reach it.

    python -m monitor.broker_tls DIR --host redis --host broker.example.com [--ca-copy DIR2]

Makes, in DIR, what is missing: `ca.pem` and `ca-key.pem` (the CA, made once), then
`broker.pem` and `broker-key.pem` (the broker's certificate and key, made again when a name
asked for is not in it, or when it expires within 30 days). `--ca-copy` copies `ca.pem` to
DIR2 (a volume holding the CA alone, for the processes that verify the broker). Region
workers verify the broker against `ca.pem` (REDIS_CA_FILE; docs/remote-regions.md).

docker-compose.yml runs it once before Redis starts (the `broker-certs` service); the dev
stack runs it for its TLS region (devstack.stack). No Django here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
BROKER_DAYS = 825  # what browsers and most TLS clients still accept for a leaf
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class Files:
    ca: Path
    ca_key: Path
    cert: Path
    key: Path


def files(directory: Path) -> Files:
    return Files(
        directory / "ca.pem",
        directory / "ca-key.pem",
        directory / "broker.pem",
        directory / "broker-key.pem",
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


def _name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_ca(f: Files, now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if f.ca.exists() and f.ca_key.exists():
        key = serialization.load_pem_private_key(f.ca_key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(f.ca.read_bytes()), key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Routewatch broker CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(f.ca_key, _pem_key(key), 0o600)
    _write(f.ca, ca.public_bytes(serialization.Encoding.PEM), 0o644)
    return ca, key


def _current(f: Files, hosts: list[str], ca: x509.Certificate, now: dt.datetime) -> bool:
    """The broker's certificate exists, is signed by this CA, names every host and is not
    about to expire."""
    if not (f.cert.exists() and f.key.exists()):
        return False
    cert = x509.load_pem_x509_certificate(f.cert.read_bytes())
    if cert.issuer != ca.subject or cert.not_valid_after_utc - now < RENEW_BEFORE:
        return False
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return all(_name(h) in names for h in hosts)


def ensure(directory: Path, hosts: list[str], key_mode: int = 0o600) -> Files:
    """Make what is missing in `directory` (see the module's docstring); returns the files.
    `key_mode`: the broker key's permissions (Redis may run as another user than the one
    making it: 0o644 in a volume only Redis mounts)."""
    if not hosts:
        raise ValueError("name at least one host the broker is reached by")
    directory.mkdir(parents=True, exist_ok=True)
    f = files(directory)
    now = dt.datetime.now(dt.UTC)
    ca, ca_key = _load_ca(f, now)
    if _current(f, hosts, ca, now):
        f.key.chmod(key_mode)
        return f
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=BROKER_DAYS))
        .add_extension(x509.SubjectAlternativeName([_name(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(f.key, _pem_key(key), key_mode)
    _write(f.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return f


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m monitor.broker_tls", description=__doc__.split("\n")[0]
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        help="a name or address region workers reach the broker by (repeat; commas allowed)",
    )
    parser.add_argument("--ca-copy", type=Path, help="also copy ca.pem into this directory")
    parser.add_argument(
        "--key-mode", default="600", help="octal permissions of broker-key.pem (default 600)"
    )
    ns = parser.parse_args(argv)
    hosts = [h.strip() for arg in ns.host for h in arg.split(",") if h.strip()]
    if not hosts:
        parser.error("give at least one --host")
    f = ensure(ns.directory, hosts, int(ns.key_mode, 8))
    if ns.ca_copy is not None:
        ns.ca_copy.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f.ca, ns.ca_copy / "ca.pem")
        (ns.ca_copy / "ca.pem").chmod(0o644)
    print(f"broker TLS: CA {f.ca}, certificate {f.cert} for {', '.join(hosts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
