"""Property-based fuzzing of the stream parsers: no uncaught exception, every input classified."""

from __future__ import annotations

import itertools
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes.formats import WIRE_FORMATS, MalformedStream, WireFormat
from probes.sse import Event, LineTooLong, SSEParser

KINDS = {"reasoning", "answer", "tool", "usage", "error", "done", "finish"}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
shaped = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(
            [
                "message_start",
                "content_block_delta",
                "message_delta",
                "message_stop",
                "error",
                "ping",
                "x",
            ]
        ),
        "choices": st.lists(
            st.fixed_dictionaries(
                {}, optional={"delta": json_values, "finish_reason": json_values}
            ),
            max_size=3,
        )
        | json_values,
        "delta": json_values,
        "usage": json_values,
        "message": json_values,
        "error": json_values,
    },
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(st.binary(max_size=200), max_size=20),
    cap=st.integers(min_value=1, max_value=300),
)
def test_the_sse_parser_takes_any_bytes(chunks: list[bytes], cap: int) -> None:
    parser = SSEParser(max_line_bytes=cap)
    try:
        for chunk in chunks:
            for event in parser.feed(chunk):
                assert isinstance(event, Event)
        parser.close()
    except LineTooLong:
        assert any(len(c) for c in chunks)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(sorted(WIRE_FORMATS)),
    name=st.sampled_from(
        [
            "",
            "ping",
            "message_start",
            "content_block_delta",
            "message_delta",
            "message_stop",
            "error",
            "other",
        ]
    ),
    data=st.one_of(st.text(max_size=60), json_values.map(json.dumps), shaped.map(json.dumps)),
)
def test_the_wire_formats_classify_every_event(fmt: str, name: str, data: str) -> None:
    try:
        pieces = WIRE_FORMATS[fmt].parse(Event(event=name, data=data))
    except MalformedStream:
        return
    for piece in pieces:
        assert piece.kind in KINDS


@given(text=st.text(min_size=1, max_size=50))
def test_split_events_parse_the_same_as_whole_ones(text: str) -> None:
    payload = ("data: " + json.dumps({"choices": [{"delta": {"content": text}}]}) + "\n\n").encode()
    whole = SSEParser().feed(payload)
    parser = SSEParser()
    pieces = []
    for i in range(len(payload)):
        pieces += parser.feed(payload[i : i + 1])
    assert [e.data for e in whole] == [e.data for e in pieces]


def _reference_events(chunks: list[bytes], cap: int) -> list[Event] | None:
    """The SSE rules written the plain way (one line at a time, decoded on its own); None where
    a line is longer than the cap. The parser splits and decodes in bulk for speed: it must
    agree with this on every input."""
    buffer, events, name, data = b"", [], "", []

    def line(raw: bytes) -> None:
        nonlocal name, data
        text = raw.rstrip(b"\r").decode("utf-8", errors="replace")
        if not text:
            if data:
                events.append(Event(event=name, data="\n".join(data)))
            name, data = "", []
        elif text.startswith(":"):
            events.append(Event(data=text[1:].strip(), comment=True))
        else:
            field, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "event":
                name = value

    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            if len(raw) > cap:
                return None
            line(raw)
        if len(buffer) > cap:
            return None
    if buffer:
        line(buffer)
    line(b"")
    return events


sse_bytes = st.lists(
    st.sampled_from(
        [
            *(b"data: ", b"data:", b"event: ", b": ping", b"\n", b"\r\n", b"\r", b":", b" "),
            *(b"x", b"\xe2\x82\xac", b"\xe2\x82", b"\xff", b'{"a": 1}', b"[DONE]", b"id: 7"),
        ]
    ),
    max_size=40,
).map(b"".join)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=sse_bytes | st.binary(max_size=300),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=8),
    cap=st.integers(min_value=1, max_value=120),
)
def test_the_sse_parser_agrees_with_the_plain_rules(
    stream: bytes, cuts: list[int], cap: int
) -> None:
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    expected = _reference_events(chunks, cap)
    parser = SSEParser(max_line_bytes=cap)
    try:
        got = [event for chunk in chunks for event in parser.feed(chunk)] + parser.close()
    except LineTooLong:
        assert expected is None
        return
    assert got == expected


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from([b"", b"event: delta\n", b": ping\n", b"data: a\n"]),
            st.sampled_from([b"data: ", b"data:", b"data:  ", b"datum: ", b"\xef\xbb\xbfdata: "]),
            sse_bytes.filter(lambda line: b"\n" not in line),
            st.sampled_from([b"\n\n", b"\r\n\n", b"\n\r\n", b"\n", b"\n\n\n"]),
        ),
        min_size=1,
        max_size=6,
    ),
    cap=st.integers(min_value=1, max_value=120),
)
def test_a_read_of_one_whole_event_parses_by_the_plain_rules(
    events: list[tuple[bytes, bytes, bytes, bytes]], cap: int
) -> None:
    # Each read one event of one data line (the engine's common read, taken on a fast path),
    # or nearly so (a line before it, a CR, no blank line), agrees with the plain rules.
    chunks = [b"".join(parts) for parts in events]
    expected = _reference_events(chunks, cap)
    parser = SSEParser(max_line_bytes=cap)
    try:
        got = [event for chunk in chunks for event in parser.feed(chunk)] + parser.close()
    except LineTooLong:
        assert expected is None
        return
    assert got == expected


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(
        st.text(max_size=40),
        json_values.map(json.dumps),
        st.dictionaries(st.text(max_size=5), json_values, max_size=3).map(json.dumps),
        st.sampled_from(
            [
                '{"a": NaN}',
                '{"a": -Infinity}',
                '{"t": "\\ud800"}',
                '{"n": 123456789012345678901234567890}',
                '{"a": 1, "a": 2}',
                '{"a": 1} ',
            ]
        ),
    )
)
def test_event_json_reads_as_the_json_module_reads_it(data: str) -> None:
    try:
        expected = json.loads(data)
    except ValueError:
        expected = None
    try:
        got = WireFormat._json(data)
    except MalformedStream:
        assert expected is None or not isinstance(expected, dict)
        return
    assert isinstance(expected, dict)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
