"""The dev stack's TLS region: stunnel in front of the embedded Redis, with a certificate of the
stack's own CA, which the region's worker verifies; without stunnel, that region falls back to
the broker in clear and says so once."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
import redis

from devstack import stack
from monitor import broker_tls
from simulator.testing import free_port
from tests import support


def _env(tmp_path: Path) -> dict[str, str]:
    return {"RW_VAR_DIR": str(tmp_path), "REDIS_URL": os.environ["REDIS_URL"]}


def test_the_tls_region_reaches_the_broker_through_stunnel_verifying_the_stacks_ca(
    tmp_path: Path,
) -> None:
    if stack._stunnel() is None:
        if os.environ.get("RW_CI"):
            pytest.fail("stunnel4 is missing in CI (.ci/run installs it)")
        pytest.skip("stunnel4 is not installed (apt-get install stunnel4)")
    port = free_port()
    made = stack.broker_over_tls(_env(tmp_path), port)
    assert made is not None
    child, worker_env = made
    assert worker_env["REDIS_URL"].startswith(f"rediss://127.0.0.1:{port}/")
    assert worker_env["REDIS_CA_FILE"] == str(tmp_path / "broker-tls" / "ca.pem")
    proc = support.start(child.argv, dict(os.environ), tmp_path / "stunnel.log")
    try:
        client = redis.Redis(
            host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=worker_env["REDIS_CA_FILE"],
            ssl_cert_reqs="required", socket_timeout=5,
        )  # fmt: skip

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        assert support.wait_until(answers, 20, 0.2), (tmp_path / "stunnel.log").read_text()
        # Verified for real: another CA's clients are refused.
        other = broker_tls.ensure(tmp_path / "other", ["127.0.0.1"])
        stranger = redis.Redis(
            host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(other.ca),
            ssl_cert_reqs="required", socket_timeout=5,
        )  # fmt: skip
        with pytest.raises(redis.ConnectionError) as refused:
            stranger.ping()
        assert isinstance(refused.value.__context__, ssl.SSLCertVerificationError) or (
            "certificate verify failed" in str(refused.value)
        )
    finally:
        support.stop(proc)


def test_without_stunnel_the_tls_region_reaches_the_broker_in_clear_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PATH without stunnel on it.
    python_only = tmp_path / "bin"
    python_only.mkdir()
    monkeypatch.setenv("PATH", str(python_only))
    assert shutil.which("stunnel4") is None
    assert stack.broker_over_tls(_env(tmp_path), free_port()) is None
    said = capsys.readouterr().out
    assert said.count("\n") == 1
    assert "stunnel is not installed: region ap-south reaches the broker in clear" in said
    # Its worker keeps the stack's own broker (no REDIS_URL of its own).
    children = stack.region_workers(_env(tmp_path), free_port(), keys=dict.fromkeys(
        [slug for slug, _ in stack.DEMO_REGIONS], "k1:" + "s" * 43))  # fmt: skip
    worker = next(c for c in children if c.name == "ap-south")
    assert "REDIS_URL" not in worker.env
    assert not any(c.name == "broker-tls" for c in children)


def test_a_region_elsewhere_gets_a_link_to_the_simulator_on_the_brokers_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With RW_BROKER_TLS_HOST, a worker in another network namespace reaches the simulator
    through a delay proxy on that address (docs/remote-regions.md); the proxy listens off
    loopback only when told to."""
    assert stack.simulator_for_elsewhere({}, 8100) is None
    assert stack.simulator_for_elsewhere({"RW_BROKER_TLS_HOST": "127.0.0.1"}, 8100) is None
    # 127.0.0.2: an address other than the loopback names the proxy allows by default, that
    # this machine has without a namespace.
    port = free_port()
    child = stack.simulator_for_elsewhere({"RW_BROKER_TLS_HOST": "127.0.0.2"}, port - 9)
    assert child is not None
    said = capsys.readouterr().out
    assert f"RW_CONNECT_TO=127.0.0.1:{port - 9}=127.0.0.2:{port}" in said
    assert "PROVIDER_ALLOW_PRIVATE_NETWORKS=true" in said
    refused = subprocess.run(
        [a for a in child.argv if a != "--not-loopback"],
        capture_output=True, text=True, timeout=60, cwd=support.ROOT,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "loopback only, unless --not-loopback" in refused.stderr
    proc = subprocess.Popen(child.argv, stdout=subprocess.PIPE, text=True, cwd=support.ROOT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(f"netem: 127.0.0.2:{port} -> 127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(10)
