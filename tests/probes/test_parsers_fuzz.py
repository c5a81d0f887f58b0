"""Property-based fuzzing of the stream parsers: no uncaught exception, every input classified."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes.formats import WIRE_FORMATS, MalformedStream
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
