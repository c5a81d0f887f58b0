"""Independent servers of the wire formats we probe, installed and run for the interop tests.

Each server comes from PyPI at a pinned version and lives in a virtualenv of its own under
var/interop-venv/ (never in the project's .venv: their pins must not move ours, and stubllm
would register a pytest plugin there). A virtualenv is made on first use and reused while its
stamp matches the pins. Servers run as real subprocesses on free loopback ports, with a clean
environment (no DATABASE_URL or REDIS_URL of ours: LiteLLM would try to use them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

from tests.support import ROOT

VENV_ROOT = ROOT / "var" / "interop-venv"

# Exact pins: these servers are what we measure against, and their behaviour (and bugs) is what
# the tests assert. LiteLLM: a release from before the March 2026 PyPI compromise (1.82.7 and
# 1.82.8 carried a credential stealer); an exact pin, never a range, for that reason too.
SUITES: dict[str, tuple[str, ...]] = {
    # Three small FastAPI/uvicorn mock servers, plus hypercorn to serve one of them over HTTP/2.
    "mocks": ("mockllm==0.0.8", "fakellm==0.3.5", "stubllm==0.1.5", "hypercorn==0.17.3"),
    # The LiteLLM proxy gateway (heavy: ~500 MB, ~100 packages).
    "litellm": ("litellm[proxy]==1.81.13",),
    # A FastAPI mock of many providers' wire formats, OpenAI Responses and Gemini native among
    # them (the newer formats' independent servers; tests/interop/test_newer_formats.py).
    "llmock": ("llmock==0.2.2",),
}
INSTALL_TIMEOUT_S = 1500.0


class Unavailable(Exception):
    """A server could not be installed or started here."""


def _stamp(name: str) -> Path:
    digest = hashlib.sha256("\n".join(SUITES[name]).encode()).hexdigest()[:12]
    return VENV_ROOT / name / f".installed-{digest}"


def venv_bin(name: str) -> Path:
    """The bin/ of the suite's virtualenv, installing it first if needed (once, under a lock)."""
    venv = VENV_ROOT / name
    if _stamp(name).exists():
        return venv / "bin"
    if os.environ.get("RW_INTEROP_NO_INSTALL"):
        raise Unavailable(f"{name} is not installed and RW_INTEROP_NO_INSTALL is set")
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    with (VENV_ROOT / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stamp(name).exists():
            return venv / "bin"
        _install(name, venv)
    return venv / "bin"


def prefetch() -> None:
    """Install every suite in background threads (low priority); a test that needs one waits
    on its lock in `venv_bin`, and a failure here is met again, and reported, there."""

    def install(name: str) -> None:
        with contextlib.suppress(Unavailable, OSError):
            venv_bin(name)

    if os.environ.get("RW_INTEROP_NO_INSTALL"):
        return
    for name in SUITES:
        if not _stamp(name).exists():
            threading.Thread(
                target=install, args=(name,), name=f"install-{name}", daemon=True
            ).start()


def _install(name: str, venv: Path) -> None:
    python = venv / "bin" / "python"
    log = VENV_ROOT / f"{name}-install.log"
    try:
        if not python.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True
            )
        with log.open("wb") as out:
            subprocess.run(
                [
                    # Below the tests' priority: it may run beside timing-sensitive tests.
                    *(["nice", "-n", "10"] if shutil.which("nice") else []),
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--quiet",
                    "--retries",
                    "2",
                    "--timeout",
                    "30",
                    *SUITES[name],
                ],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=INSTALL_TIMEOUT_S,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
        raise Unavailable(f"cannot install {' '.join(SUITES[name])}: {exc}\n{tail}") from None
    # The compromised LiteLLM releases ran their payload from a .pth file at every Python start.
    site = next((venv / "lib").glob("python*/site-packages"))
    strays = [p.name for p in site.glob("*.pth") if "litellm" in p.name]
    if strays:
        raise Unavailable(f"refusing a virtualenv with unexpected startup files: {strays}")
    for old in venv.glob(".installed-*"):
        old.unlink()
    _stamp(name).touch()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """Only what a server needs: none of our service URLs, keys or settings."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(VENV_ROOT / "home"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(extra)
    return env


@dataclass
class Server:
    """One server subprocess in a process group of its own (so signals reach it alone)."""

    name: str
    argv: Sequence[str]
    port: int
    log: Path
    env: dict[str, str] = field(default_factory=clean_env)
    ready_path: str = "/"
    scheme: str = "http"
    ca: str | None = None  # CA bundle for a TLS server
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def origin(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> Server:
        Path(self.env["HOME"]).mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                list(self.argv),
                env=self.env,
                cwd=self.cwd or self.log.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=self.ca) if self.ca else False
        )
        with httpx2.Client(verify=verify, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise Unavailable(f"{self.name} exited at start:\n{self.log_tail()}")
                with contextlib.suppress(httpx2.HTTPError):
                    client.get(self.origin + self.ready_path)
                    return self
                time.sleep(0.2)
        self.stop()
        raise Unavailable(f"{self.name} did not answer within {timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 1500) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections and takes bytes; nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the kernel closes every connection at once, mid-stream or not."""
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(8)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)


@contextlib.contextmanager
def running(server: Server, timeout_s: float = 60.0) -> Iterator[Server]:
    server.start(timeout_s)
    try:
        yield server
    finally:
        server.stop()
