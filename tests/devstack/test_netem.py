"""The delay proxy adds the region's round trip to every exchange, in order, over real sockets."""

from __future__ import annotations

import asyncio
import time

from devstack.netem import DelayProxy


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_each_round_trip_takes_the_configured_rtt_and_bytes_stay_in_order() -> None:
    async def scenario() -> tuple[list[float], bytes]:
        server, port = await _echo_server()
        proxy = DelayProxy(("127.0.0.1", 0), ("127.0.0.1", port), rtt_ms=80)
        proxy_port = await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        rtts = []
        for i in range(5):
            t0 = time.perf_counter()
            writer.write(f"ping {i}\n".encode())
            await writer.drain()
            await reader.readline()
            rtts.append((time.perf_counter() - t0) * 1000)
        payload = bytes(range(256)) * 4096  # 1 MiB through the proxy and back
        writer.write(payload)
        await writer.drain()
        echoed = await reader.readexactly(len(payload))
        writer.close()
        assert proxy.server is not None
        proxy.server.close()
        server.close()
        return rtts, echoed if echoed == payload else b""

    rtts, echoed = asyncio.run(scenario())
    assert all(rtt >= 80 for rtt in rtts), rtts
    assert sorted(rtts)[2] < 160, rtts  # the median exchange is not delayed twice
    assert echoed, "bytes came back altered or out of order"
