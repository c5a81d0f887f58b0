"""The deployment files hold their invariants, checked on what docker-compose really renders
from .env.example, and by running what the compose file runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db import connection

from devstack.embedded import POSTGRES_MAJOR
from monitor import limits
from simulator.testing import free_port
from tests import support

ROOT = support.ROOT
# What only the server side may hold.
SERVER_SECRETS = {
    "DATABASE_URL",
    "POSTGRES_PASSWORD",
    "SECRET_KEY",
    "FIELD_ENCRYPTION_KEYS",
    "EMAIL_HOST_PASSWORD",
    "METRICS_BEARER_TOKEN",
}
LONG_RUNNING = {"web", "beat", "scheduler", "ingest", "background"}
REAL_HOST = "routewatch.example.com"


def _binary() -> str:
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("RW_CI"):
            pytest.fail("docker-compose is missing in CI (.ci/run installs it)")
        pytest.skip("docker-compose is not installed")
    return binary


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`docker-compose --env-file .env.example config`, parsed."""
    binary = _binary()
    where = tmp_path_factory.mktemp("compose")
    shutil.copy(ROOT / "docker-compose.yml", where / "docker-compose.yml")
    shutil.copy(ROOT / ".env.example", where / ".env.example")
    shutil.copy(ROOT / ".env.example", where / ".env")  # env_file: .env
    result = subprocess.run(
        [binary, "--env-file", ".env.example", "config"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def _services(rendered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = rendered["services"]
    return services


def _region_workers(rendered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _services(rendered).items() if n.startswith("worker-")}


def test_region_workers_get_the_broker_and_their_region_key_only(rendered) -> None:
    workers = _region_workers(rendered)
    assert set(workers) == {"worker-us-east", "worker-eu-west", "worker-ap-south"}
    for name, service in workers.items():
        env = service.get("environment", {})
        assert "env_file" not in service, name
        assert SERVER_SECRETS.isdisjoint(env), (name, sorted(SERVER_SECRETS & set(env)))
        assert not any(k.startswith("EMAIL_") for k in env), name
        assert set(env) == {
            "RW_WORKER_ONLY",
            "RW_REGION",
            "RW_REGION_KEYS",
            "REDIS_URL",
            "REDIS_CA_FILE",
            "RW_SPOOL_DIR",
        }
        assert env["RW_WORKER_ONLY"] == "true"
        assert f"probes.{env['RW_REGION']}" in service["command"]
        # The threads pool: a slow probe holds no slot another message needs.
        pool = limits.region_worker_args()
        command = " ".join(service["command"])
        assert " ".join(pool[:2]) in command, name
        assert " ".join(pool[-2:]) in command, name
        assert "postgres" not in service.get("depends_on", {})
        assert env["REDIS_URL"].startswith("rediss://routewatch:")  # a password, never anonymous


def test_every_service_that_needs_the_schema_waits_for_migrate(rendered) -> None:
    services = _services(rendered)
    for name in LONG_RUNNING:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["postgres"]["condition"] == "service_healthy", name
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in LONG_RUNNING | set(_region_workers(rendered)):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_workers_yield_the_cpu_to_the_web_between_containers(rendered) -> None:
    """Nice values do not cross containers (each has its own CPU cgroup): the background worker
    (overview rebuilds, retention) and region workers carry a lower CPU weight than the web,
    which keeps Docker's default (1024). The tick and ingest, whose lag is a target, keep the
    web's weight and priority, and consume nothing else."""
    services = _services(rendered)
    web = int(services["web"].get("cpu_shares", 1024))
    for name in {"background", *_region_workers(rendered)}:
        assert int(services[name].get("cpu_shares", 1024)) < web, name
    for name, queue in (("scheduler", "schedule"), ("ingest", "ingest")):
        assert int(services[name].get("cpu_shares", 1024)) == web, name
        assert services[name]["environment"]["RW_WORKER_NICE"] == "0", name
        command = services[name]["command"]
        assert command[command.index("--queues") + 1] == queue, name
    command = services["background"]["command"]
    assert command[command.index("--queues") + 1] == "default"


def test_postgres_is_the_embedded_major_and_redis_needs_a_password(rendered) -> None:
    services = _services(rendered)
    assert services["postgres"]["image"] == f"postgres:{POSTGRES_MAJOR}"
    redis_args = services["redis"]["command"]
    user = redis_args.index("default")
    assert redis_args[user - 1 : user + 2] == ["--user", "default", "off"]
    assert any(arg.startswith(">") and len(arg) > 1 for arg in redis_args)


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """target -> (source, mode); docker-compose renders a mount as "source:target:mode"."""
    found = {}
    for mount in service.get("volumes", []):
        source, target, mode = mount.split(":")
        found[target] = (source, mode)
    return found


def test_the_broker_speaks_tls_only_and_every_client_verifies_it_against_our_ca(
    rendered,
) -> None:
    services = _services(rendered)
    redis = services["redis"]
    args = redis["command"]
    assert args[args.index("--port") + 1] == "0"  # no clear-text port, not even inside
    assert args[args.index("--tls-port") + 1] == "6380"
    cert, key = args[args.index("--tls-cert-file") + 1], args[args.index("--tls-key-file") + 1]
    # Only the TLS port is published (for regions elsewhere).
    assert [int(p["target"]) for p in redis.get("ports", [])] == [6380]
    # The certificates are made before Redis starts, in a volume Redis mounts read-only.
    certs = services["broker-certs"]
    assert redis["depends_on"]["broker-certs"]["condition"] == "service_completed_successfully"
    assert _mounts(redis)["/tls"] == ("brokertls", "ro")
    assert cert.startswith("/tls/")
    assert key.startswith("/tls/")
    assert "monitor.broker_tls /tls --ca-copy /ca" in " ".join(certs["command"])
    assert "host redis," in " ".join(certs["command"])  # the name the clients use
    healthcheck = " ".join(redis["healthcheck"]["test"])
    assert "--tls --cacert /tls/ca.pem" in healthcheck
    # Every client (servers and region workers) over TLS, verified against the CA alone.
    clients = {n: s for n, s in services.items() if "REDIS_URL" in s.get("environment", {})}
    assert LONG_RUNNING | set(_region_workers(rendered)) <= set(clients)
    for name, service in clients.items():
        env = service["environment"]
        assert env["REDIS_URL"].startswith("rediss://routewatch:"), name
        assert env["REDIS_URL"].endswith("@redis:6380/0"), name
        # The CA alone, read-only: never the broker's key.
        assert _mounts(service)[str(Path(env["REDIS_CA_FILE"]).parent)] == ("brokerca", "ro")


def test_the_broker_certificates_name_its_hosts_and_chain_to_the_ca(tmp_path: Path) -> None:
    """What the broker-certs service runs, on the image's Python: run twice, it keeps the CA
    (clients keep verifying) and makes the broker's certificate again only for a new name."""
    from cryptography import x509

    def run(*hosts: str) -> None:
        argv = [sys.executable, "-m", "monitor.broker_tls", str(tmp_path / "tls"),
                "--ca-copy", str(tmp_path / "ca"), "--key-mode", "644",
                "--host", ",".join(hosts)]  # fmt: skip
        env = {"PATH": os.environ["PATH"]}  # no Django settings needed
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    run("redis", "localhost", "")
    ca = (tmp_path / "ca" / "ca.pem").read_bytes()
    first = (tmp_path / "tls" / "broker.pem").read_bytes()
    run("redis", "localhost")
    assert (tmp_path / "tls" / "broker.pem").read_bytes() == first
    run("redis", "localhost", "broker.example.com", "203.0.113.7")
    assert (tmp_path / "ca" / "ca.pem").read_bytes() == ca
    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / "broker.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["redis", "localhost", "broker.example.com"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["203.0.113.7"]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    assert (tmp_path / "tls" / "ca-key.pem").stat().st_mode & 0o077 == 0
    assert not (tmp_path / "ca" / "ca-key.pem").exists()


def test_the_image_leaves_local_secrets_and_data_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".env", "var/", ".venv/", ".git/", "test-artifacts/", "**/__pycache__/"):
        assert entry in ignored


def test_a_region_worker_starts_with_exactly_its_compose_environment(rendered) -> None:
    env = dict(_region_workers(rendered)["worker-eu-west"]["environment"])
    env["REDIS_URL"] = os.environ["REDIS_URL"]  # the test broker instead of the compose one
    env["RW_REGION_KEYS"] = "k1:" + "s" * 43
    env.update(PATH=os.environ["PATH"], DJANGO_SETTINGS_MODULE="monitor.settings")
    code = "import django; django.setup(); import monitor.tasks; print('worker settings ok')"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "worker settings ok" in result.stdout


@pytest.fixture
def web_for_a_real_host(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = support.child_env(
        connection.settings_dict, ALLOWED_HOSTS=REAL_HOST, SITE_URL=f"https://{REAL_HOST}"
    )
    proc = support.start(
        [sys.executable, "-m", "gunicorn", "monitor.wsgi", "--bind", f"127.0.0.1:{port}"],
        env,
        tmp_path / "web.log",
    )
    try:
        yield port
    finally:
        support.stop(proc)


@pytest.mark.django_db(transaction=True)
def test_the_web_healthcheck_passes_when_allowed_hosts_is_a_real_host_name(
    rendered, web_for_a_real_host: int
) -> None:
    argv = _services(rendered)["web"]["healthcheck"]["test"]
    assert argv[0] == "CMD"
    command = [a.replace("127.0.0.1:8000", f"127.0.0.1:{web_for_a_real_host}") for a in argv[1:]]
    command[0] = sys.executable if command[0] == "python" else command[0]

    def healthy() -> bool:
        return subprocess.run(command, capture_output=True, timeout=20).returncode == 0

    assert support.wait_until(healthy, timeout_s=30)
    # Host validation still guards every other page.
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{web_for_a_real_host}/accounts/login/", timeout=5)
    assert refused.value.code == 400


# --- a region on a machine of its own (docker-compose.region.yml, docs/remote-regions.md) ----


@pytest.fixture(scope="module")
def region_rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`docker-compose -f docker-compose.region.yml --env-file .env.example config`, parsed."""
    binary = _binary()
    where = tmp_path_factory.mktemp("compose-region")
    shutil.copy(ROOT / "docker-compose.region.yml", where / "docker-compose.region.yml")
    result = subprocess.run(
        [binary, "-f", "docker-compose.region.yml", "--env-file", str(ROOT / ".env.example"),
         "config"],
        cwd=where, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_the_region_compose_file_runs_one_worker_with_the_broker_over_verified_tls(
    region_rendered,
) -> None:
    services = _services(region_rendered)
    assert set(services) == {"region-worker"}
    worker = services["region-worker"]
    env = worker["environment"]
    assert "env_file" not in worker
    assert set(env) == {
        "RW_WORKER_ONLY", "RW_REGION", "RW_REGION_KEYS", "REDIS_URL", "REDIS_CA_FILE",
        "RW_SPOOL_DIR",
    }  # fmt: skip
    assert env["REDIS_URL"].startswith("rediss://routewatch:")
    assert env["REDIS_URL"].endswith(":6380/0")
    assert "ports" not in worker  # it listens for nothing
    assert worker["command"] == ["python", "-m", "monitor.region_worker", "run"]
    assert worker["healthcheck"]["test"] == [
        "CMD",
        "python",
        "-m",
        "monitor.region_worker",
        "health",
    ]
    # docker-compose renders a mount as "source:target[:mode]".
    mounts = {target: (source, mode) for source, target, *mode in
              (m.split(":") for m in worker["volumes"])}  # fmt: skip
    # The spool (and the replay record beside it) on a named volume: recreating keeps them.
    source, _ = mounts[env["RW_SPOOL_DIR"]]
    assert source in region_rendered["volumes"]
    source, mode = mounts[env["REDIS_CA_FILE"]]
    assert source.startswith("/")
    assert mode == ["ro"]


def test_the_settings_verify_a_rediss_broker_against_its_ca(tmp_path: Path) -> None:
    """kombu would connect to a rediss:// broker without checking its certificate; the settings
    make every client of the broker verify it, against REDIS_CA_FILE."""
    env = {
        "PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "monitor.settings",
        "RW_WORKER_ONLY": "true", "RW_REGION": "eu-west", "RW_REGION_KEYS": "k1:" + "s" * 43,
        "REDIS_URL": "rediss://routewatch:pw@broker.example.com:6380/0",
        "REDIS_CA_FILE": "/run/routewatch/broker-ca.pem",
    }  # fmt: skip
    code = (
        "import django; django.setup(); from monitor.celery import app; "
        "c = app.connection_for_read(); print(c.ssl)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "'ssl_cert_reqs': <VerifyMode.CERT_REQUIRED: 2>" in result.stdout, result.stdout
    assert "'ssl_ca_certs': '/run/routewatch/broker-ca.pem'" in result.stdout, result.stdout


def test_the_image_runs_a_region_worker_by_default_and_systemd_restarts_one() -> None:
    lines = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines() if ln.startswith("CMD")]
    assert lines[-1] == 'CMD ["python", "-m", "monitor.region_worker", "run"]'
    unit = (ROOT / "deploy/systemd/routewatch-region-worker.service").read_text()
    assert "ExecStart=/opt/routewatch/.venv/bin/python -m monitor.region_worker run" in unit
    assert "Restart=always" in unit
    assert "RW_SPOOL_DIR=/var/lib/routewatch/spool" in unit


def test_the_health_command_fails_without_a_live_worker(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "RW_SPOOL_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "monitor.region_worker", "health"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "UNHEALTHY: no health file" in result.stdout
