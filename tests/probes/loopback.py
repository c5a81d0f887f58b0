"""A tiny real HTTP/1.1 server on 127.0.0.1, for responses the simulated provider cannot give.

It runs on its own event loop in a thread (h11 for the HTTP, asyncio streams for the socket),
so a test drives the real probe engine over a real socket against it. Each request goes to a
handler that returns a Reply: a status, headers, and body chunks with the delay before each;
or a misbehaviour (close before answering, bytes that are not HTTP). The server records what
it received and when it handed each chunk to the kernel (perf_counter, comparable with the
engine's stamps in this process), as a ground truth.

Replies meant to be faithful to a real API use the bytes its documentation and public issue
reports show (tests/probes/real_apis.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import h11


@dataclass
class Received:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    head: list[tuple[str, str]] = field(default_factory=list)  # the headers as sent, in order

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # (delay before, bytes)
    close_before_headers: bool = False  # read the request, then close the connection
    raw: bytes | None = None  # written as they are, then the connection closes
    sent_at: list[float] = field(default_factory=list)  # filled in: when each chunk was written


Handler = Callable[[Received], Reply]


class LoopbackServer:
    """`with LoopbackServer(handler) as server: server.url ...`"""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.received: list[Received] = []
        self.replies: list[Reply] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the loopback server did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read_request(conn, reader)
                if request is None:
                    return
                self.received.append(request)
                reply = self.handler(request)
                self.replies.append(reply)
                if reply.close_before_headers:
                    return
                if reply.raw is not None:
                    writer.write(reply.raw)
                    await writer.drain()
                    return
                await self._respond(conn, writer, reply)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError):
            return
        finally:
            writer.close()

    @staticmethod
    async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> Received | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data and head is None:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                headers = {k.decode().lower(): v.decode() for k, v in head.headers}
                raw = [(k.decode(), v.decode()) for k, v in head.headers.raw_items()]
                return Received(
                    head.method.decode(), head.target.decode(), headers, bytes(body), raw
                )
            elif isinstance(event, h11.ConnectionClosed):
                return None

    @staticmethod
    async def _respond(conn: h11.Connection, writer: asyncio.StreamWriter, reply: Reply) -> None:
        writer.write(conn.send(h11.Response(status_code=reply.status, headers=reply.headers)))
        await writer.drain()
        for delay, data in reply.chunks:
            if delay > 0:
                await asyncio.sleep(delay)
            framed = conn.send(h11.Data(data=data))
            reply.sent_at.append(time.perf_counter())  # just before the kernel gets it
            writer.write(framed)
            await writer.drain()
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


def sse(*objects: Any, done: bool = True) -> list[bytes]:
    """`data:` events, one per object (a str is sent as it is), then `data: [DONE]`."""
    events = [
        f"data: {o if isinstance(o, str) else json.dumps(o, separators=(',', ':'))}\n\n".encode()
        for o in objects
    ]
    return [*events, b"data: [DONE]\n\n"] if done else events


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and its body (a Content-Length one, or none), for a server written
    with asyncio streams directly."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    return head, await reader.readexactly(length)
