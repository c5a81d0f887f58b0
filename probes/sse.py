"""An incremental Server-Sent Events parser with a hard cap on line length.

Feed it raw bytes as they arrive; it returns complete events. It never holds more than
`max_line_bytes` of an unfinished line: a longer line raises LineTooLong at once, so a 50 MB
line without a newline costs at most the cap in memory. Comments (`: keep-alive`) come back as
events with `comment=True`, so callers can tell a trickle of keep-alives from data.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class LineTooLong(Exception):
    pass


@dataclass
class Event:
    event: str = ""
    data: str = ""
    comment: bool = False


@dataclass
class SSEParser:
    max_line_bytes: int = 1024 * 1024
    _buffer: bytearray = field(default_factory=bytearray)
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[Event]:
        events: list[Event] = []
        self._buffer += chunk
        start = 0
        buf = self._buffer
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(buf[start:nl])
            start = nl + 1
            if len(line) > self.max_line_bytes:
                raise LineTooLong(f"a line exceeds {self.max_line_bytes} bytes")
            self._line(line.rstrip(b"\r"), events)
        del buf[:start]
        if len(buf) > self.max_line_bytes:
            raise LineTooLong(f"a line exceeds {self.max_line_bytes} bytes")
        return events

    def close(self) -> list[Event]:
        """End of stream: a final event without its blank line still counts."""
        events: list[Event] = []
        if self._buffer:
            self._line(bytes(self._buffer).rstrip(b"\r"), events)
            self._buffer.clear()
        self._dispatch(events)
        return events

    def _line(self, raw: bytes, events: list[Event]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if not line:
            self._dispatch(events)
            return
        if line.startswith(":"):
            events.append(Event(data=line[1:].strip(), comment=True))
            return
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value

    def _dispatch(self, events: list[Event]) -> None:
        if self._data:
            events.append(Event(event=self._event, data="\n".join(self._data)))
        self._event = ""
        self._data = []
