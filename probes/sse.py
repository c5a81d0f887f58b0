"""An incremental Server-Sent Events parser with a hard cap on line length.

Feed it raw bytes as they arrive; it returns complete events. It never holds more than
`max_line_bytes` of an unfinished line: a longer line raises LineTooLong at once, so a 50 MB
line without a newline costs at most the cap in memory. Comments (`: keep-alive`) come back as
events with `comment=True`, so callers can tell a trickle of keep-alives from data. The first
line that is no SSE field at all (`<!DOCTYPE html>`) is kept in `foreign`, so a body that is
not an event stream can be told from one that merely broke off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probes.errors import LineTooLong

__all__ = ["Event", "LineTooLong", "SSEParser"]


@dataclass(slots=True)
class Event:
    """One event of a stream: an SSE event, or one message of AWS's binary event-stream
    (probes/bedrock.py), where `event` is its event type or, with `exception`, its exception
    type."""

    event: str = ""
    data: str = ""
    comment: bool = False
    exception: bool = False


@dataclass
class SSEParser:
    max_line_bytes: int = 1024 * 1024
    _buffer: bytearray = field(default_factory=bytearray)
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    foreign: str | None = None  # the first line that is not an SSE field

    def feed(self, chunk: bytes) -> list[Event]:
        cap = self.max_line_bytes
        if (
            chunk.startswith(b"data:")
            and chunk.find(b"\n") == len(chunk) - 2  # one line, then the blank line
            and chunk.endswith(b"\n\n")
            and not (self._buffer or self._data or chunk.endswith(b"\r\n\n"))
            and len(chunk) - 2 <= cap
        ):
            # The common read: one whole event of one data line (an event a chunk), taken as
            # the loop below takes it, without splitting lines.
            cut = 6 if chunk.startswith(b" ", 5) else 5
            event = Event(self._event, chunk[cut:-2].decode("utf-8", errors="replace"))
            self._event = ""
            return [event]
        if self._buffer:
            self._buffer += chunk
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            data = chunk
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) > cap:
                raise LineTooLong(f"a line exceeds {cap} bytes")
            self._buffer += data
            return []
        complete = data[:end]
        if len(complete) > cap and any(len(line) > cap for line in complete.split(b"\n")):
            raise LineTooLong(f"a line exceeds {cap} bytes")
        if len(data) - end - 1 > cap:
            raise LineTooLong(f"a line exceeds {cap} bytes")
        self._buffer += data[end + 1 :]
        events: list[Event] = []
        # One decode for all complete lines: a newline byte never sits inside a UTF-8
        # sequence, so this equals decoding line by line.
        text = complete.decode("utf-8", errors="replace")
        lines = text.split("\n")
        if "\r" in text:
            lines = [line.rstrip("\r") for line in lines]
        data_lines = self._data
        for line in lines:
            # The common lines, a data line and the blank line that ends an event, are taken
            # inline: no method call per event.
            if line.startswith("data:"):
                data_lines.append(line[6:] if line.startswith(" ", 5) else line[5:])
            elif not line:
                if data_lines:
                    events.append(Event(self._event, "\n".join(data_lines)))
                    data_lines = self._data = []
                self._event = ""
            else:
                self._line(line, events)
                data_lines = self._data  # a dispatch starts a new list
        return events

    def close(self) -> list[Event]:
        """End of stream: a final event without its blank line still counts."""
        events: list[Event] = []
        if self._buffer:
            self._line(self._buffer.decode("utf-8", errors="replace").rstrip("\r"), events)
            self._buffer.clear()
        self._dispatch(events)
        return events

    def _line(self, line: str, events: list[Event]) -> None:
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
        elif self.foreign is None and name not in ("id", "retry"):
            self.foreign = line[:200]

    def _dispatch(self, events: list[Event]) -> None:
        if self._data:
            events.append(Event(event=self._event, data="\n".join(self._data)))
        self._event = ""
        self._data = []
