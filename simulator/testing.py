"""Start the simulator in a subprocess for tests, benchmarks and the demo."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "configs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SimulatorProcess:
    """`with SimulatorProcess(CONFIGS / "test.toml") as sim: sim.base_url ...`

    Runs `python -m simulator` on a free 127.0.0.1 port and waits for /_sim/health.
    tls=True: HTTPS with a trustme CA written to `ca_pem_path`. http2=False: the server offers
    HTTP/1.1 only (no ALPN h2, no h2c). processes=N: N worker processes on the port.
    """

    def __init__(
        self,
        config: Path | str,
        *,
        tls: bool = False,
        http2: bool = True,
        port: int | None = None,
        seed: int | None = None,
        processes: int = 1,
    ) -> None:
        self.config = Path(config)
        self.tls = tls
        self.http2 = http2
        self.seed = seed
        self.processes = processes
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="simulator-"))
        self.ca_pem_path = self.folder / "ca.pem"
        self.log_path = self.folder / "simulator.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> SimulatorProcess:
        argv = [
            sys.executable,
            "-m",
            "simulator",
            "--config",
            str(self.config),
            "--port",
            str(self.port),
        ]
        if self.tls:
            argv += ["--tls", "--ca-out", str(self.ca_pem_path)]
        if not self.http2:
            argv.append("--no-http2")
        if self.seed is not None:
            argv += ["--seed", str(self.seed)]
        if self.processes != 1:
            argv += ["--processes", str(self.processes)]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited: {self.log_path.read_text()[-2000:]}")
            if self._healthy():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"simulator did not start: {self.log_path.read_text()[-2000:]}")

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this simulator's CA (TLS only)."""
        return ssl.create_default_context(cafile=str(self.ca_pem_path))

    def _healthy(self) -> bool:
        context = None
        if self.tls:
            if not self.ca_pem_path.exists():
                return False
            context = self.ssl_context()
        try:
            with urllib.request.urlopen(  # noqa: S310 (our own loopback URL)
                f"{self.base_url}/_sim/health", timeout=2, context=context
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
