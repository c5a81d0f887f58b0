"""python -m simulator --config FILE --port N [--host 127.0.0.1] [--tls] [--certfile F --keyfile F]
[--ca-out F] [--no-http2] [--seed N] [--loop uvloop|asyncio] [--processes N] [--backlog N]"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from simulator import cluster
from simulator.app import SimulatorApp
from simulator.config import Config, ConfigFileError, load
from simulator.server import serve_socket, tls_context


def _tls_files(ns: argparse.Namespace) -> tuple[str, str]:
    if ns.certfile and ns.keyfile:
        return ns.certfile, ns.keyfile
    import trustme

    ca = trustme.CA(organization_name="Routewatch simulator test CA")
    cert = ca.issue_cert("127.0.0.1", "localhost", "::1")
    folder = Path(tempfile.mkdtemp(prefix="simulator-tls-"))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca_out = Path(ns.ca_out) if ns.ca_out else folder / "ca.pem"
    # Written under a temporary name and renamed: a waiting test never reads half a file.
    partial = ca_out.with_name(ca_out.name + ".partial")
    ca.cert_pem.write_to_path(str(partial))
    partial.replace(ca_out)
    print(f"simulator: CA certificate at {ca_out}", flush=True)
    return str(cert_path), str(key_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m simulator", description="Simulated LLM providers (OpenAI and Anthropic)"
    )
    parser.add_argument("--config", required=True, help="TOML file of providers and models")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tls", action="store_true", help="serve HTTPS (HTTP/1.1 and HTTP/2)")
    parser.add_argument("--certfile")
    parser.add_argument("--keyfile")
    parser.add_argument("--ca-out", help="where to write the generated CA certificate (PEM)")
    parser.add_argument(
        "--no-http2", action="store_true", help="offer HTTP/1.1 only (no ALPN h2, no h2c)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for jitter and faults")
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="event loop (uvloop if installed)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes sharing the port (SO_REUSEPORT); see simulator/README.md",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=4096,
        help="listen queue per process (the kernel caps it at net.core.somaxconn)",
    )
    ns = parser.parse_args(argv)
    if not 1 <= ns.processes <= cluster.MAX_PROCESSES:
        parser.error(f"--processes must be 1 to {cluster.MAX_PROCESSES}")
    if ns.backlog < 1:
        parser.error("--backlog must be at least 1")
    if bool(ns.certfile) != bool(ns.keyfile):
        parser.error("--certfile and --keyfile go together")
    try:
        config = load(ns.config)
    except ConfigFileError as exc:
        sys.exit(f"simulator: {exc}")
    ssl_context = None
    if ns.tls or ns.certfile:
        ssl_context = tls_context(*_tls_files(ns), http2=not ns.no_http2)
    try:
        listeners = cluster.bind(ns.processes, ns.host, ns.port, ns.backlog)
    except OSError as exc:
        sys.exit(f"simulator: cannot listen on {ns.host}:{ns.port}: {exc}")
    # Everything loaded from here on (modules, the tokenizer) lives as long as the process (and
    # is shared by forked workers): a full collection walking it paused every stream for
    # 30-50 ms. Collections now see only what requests allocate.
    SimulatorApp(config).warm_up()
    gc.collect()
    gc.freeze()
    scheme = "https" if ssl_context else "http"
    serving = f"serving {', '.join(config.providers)} on {scheme}://{ns.host}:{ns.port}"
    if ns.processes == 1:
        _run_loop(ns.loop, _worker(ns, config, ssl_context, None, listeners[0], serving))
        return
    status = cluster.run(
        listeners,
        config,
        lambda c, sock: _run_loop(ns.loop, _worker(ns, config, ssl_context, c, sock, "")),
        lambda: print(f"simulator: {serving} ({ns.processes} processes)", flush=True),
    )
    sys.exit(status)


def _worker(
    ns: argparse.Namespace,
    config: Config,
    ssl_context: ssl.SSLContext | None,
    member: cluster.Cluster | None,
    listener: socket.socket,
    serving: str,
) -> Callable[[], Coroutine[Any, Any, None]]:
    async def run() -> None:
        app = SimulatorApp(config, seed=ns.seed, cluster=member)
        http2 = not ns.no_http2
        server = await serve_socket(
            app, listener, ssl_context=ssl_context, http2=http2, backlog=ns.backlog
        )
        servers = [server]
        if member is not None:
            servers.append(await serve_socket(app.peer, member.sockets["peer"], backlog=128))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if serving:
            print(f"simulator: {serving}", flush=True)
        try:
            await stop.wait()
        finally:
            for each in servers:
                each.close()

    return run


def _run_loop(choice: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:  # optional: plain asyncio works, with more send lag under load
            pass
        else:
            uvloop.run(run())
            return
    asyncio.run(run())


if __name__ == "__main__":
    main()
