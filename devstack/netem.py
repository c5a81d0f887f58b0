"""A user-space network delay proxy: how demo regions differ on one machine.

    python -m devstack.netem --listen 127.0.0.1:9101 --target 127.0.0.1:8100 --rtt-ms 80

Every byte from the client reaches the target half a round trip later, and every byte back
reaches the client half a round trip later, in order (Linux tc netem is not available here).
A demo region's worker reaches the simulated providers through its own proxy (the worker's
RW_CONNECT_TO setting), so its probes really take that region's network path; nothing in the
probe adds made-up numbers. The TCP handshake to the proxy itself is local, so a cold
connection's connect_ms does not include the delay; every request/response exchange does.
No Django here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

log = logging.getLogger("devstack.netem")
READ_SIZE = 65536


def _deliver(writer: asyncio.StreamWriter, data: bytes) -> None:
    if writer.is_closing():
        return
    if data:
        writer.write(data)
    elif writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy reader to writer, each chunk delivered `delay_s` after it was read, in order
    (timer handles with increasing deadlines run in order)."""
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(READ_SIZE):
            loop.call_at(loop.time() + delay_s, _deliver, writer, data)
    except (ConnectionError, OSError):
        pass
    loop.call_at(loop.time() + delay_s, _deliver, writer, b"")
    await asyncio.sleep(delay_s)


class DelayProxy:
    def __init__(self, listen: tuple[str, int], target: tuple[str, int], rtt_ms: float) -> None:
        self.listen = listen
        self.target = target
        self.one_way_s = rtt_ms / 2000.0
        self.server: asyncio.Server | None = None

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.warning("cannot reach %s:%s: %s", *self.target, exc)
            client_w.close()
            return
        try:
            await asyncio.gather(
                _pipe(client_r, upstream_w, self.one_way_s),
                _pipe(upstream_r, client_w, self.one_way_s),
            )
        except asyncio.CancelledError:
            # The proxy is stopping: the connection just closes (asyncio would log a
            # traceback for every open connection's cancelled handler).
            pass
        finally:
            for w in (client_w, upstream_w):
                w.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await w.wait_closed()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, *self.listen)
        return int(self.server.sockets[0].getsockname()[1])

    async def serve_forever(self) -> None:
        assert self.server is not None
        async with self.server:
            await self.server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _main(ns: argparse.Namespace) -> None:
    proxy = DelayProxy(ns.listen, ns.target, ns.rtt_ms)
    port = await proxy.start()
    print(
        f"netem: 127.0.0.1:{port} -> {ns.target[0]}:{ns.target[1]} rtt {ns.rtt_ms} ms", flush=True
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(proxy.serve_forever())
    await stop.wait()
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.netem", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--listen", type=_addr, required=True, help="HOST:PORT to listen on")
    parser.add_argument("--target", type=_addr, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, required=True, help="round-trip time to add")
    ns = parser.parse_args(argv)
    if ns.listen[0] not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the delay proxy listens on loopback only")
    asyncio.run(_main(ns))


if __name__ == "__main__":
    main()
