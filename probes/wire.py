"""What every wire format is made of: the pieces a stream is classified into, usage, what
served a probe, the framing protocol, and the WireFormat base class with the helpers the
dialects share (counts as servers report them, error bodies, refused parameters, extra body
fields). The dialects themselves: probes/formats.py (Chat Completions, Azure OpenAI, Anthropic
Messages, and the registry), probes/responses.py, probes/gemini.py, probes/bedrock.py.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from probes.errors import InvalidSpec, MalformedStream, RefusedParameter
from probes.model import TOKEN_LIMIT_PARAMS, ProbeSpec
from probes.prompts import Prompt
from probes.sse import Event, SSEParser

__all__ = ["Framing", "MalformedStream", "Piece", "Served", "Usage", "WireFormat"]

REASONING = "reasoning"
ANSWER = "answer"
TOOL = "tool"
USAGE = "usage"
ERROR = "error"
DONE = "done"
FINISH = "finish"

# The largest count the database stores in an integer column (Postgres integer).
MAX_COUNT = 2**31 - 1
# Body keys the probe owns: what is measured (the prompt, the model, streaming).
PROTECTED_BODY_KEYS = frozenset({"model", "messages", "system", "stream", "stream_options"})
_REFUSING_CODES = ("unsupported_parameter", "unsupported_value")
_NOT_SUPPORTED = "is not supported"
_BAD_VALUE = "does not accept the value sent"
# (pattern naming the parameter, what it says about it), first match wins.
_REFUSALS = [
    (re.compile(r"Unsupported parameter: '([\w.]+)'"), _NOT_SUPPORTED),
    (re.compile(r"Unsupported value: '([\w.]+)'"), _BAD_VALUE),
    (re.compile(r"Unrecognized request arguments? supplied: ([\w.]+)"), _NOT_SUPPORTED),
    (re.compile(r"(?m)^`?([\w.]+)`?: Extra inputs are not permitted"), _NOT_SUPPORTED),
    (re.compile(r"'([\w.]+)' is not (?:supported|allowed)"), _NOT_SUPPORTED),
    (re.compile(r"^`?([\w.]+)`? (?:is not supported|is not allowed|may only be set)"), _BAD_VALUE),
    # Anthropic (and pydantic servers) start a 400's message with the field: "field: why".
    (re.compile(r"^`?([\w.]+)`?: "), "was refused"),
]
# Never "our settings": a refusal about these is about the prompt or the model id.
_NOT_SETTINGS = frozenset({"model", "messages", "system", "stream"})
_INSTEAD = re.compile(r"[Uu]se '([\w.]+)' instead")
# The json module's scanner (C where available: the one json.loads runs) and the whitespace it
# allows around a value (json.decoder.WHITESPACE).
_scan_json: Callable[[str, int], tuple[Any, int]]
_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"


@dataclass(slots=True)
class Piece:
    kind: str
    text: str = ""
    usage: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None  # the event's object, for what served the probe
    # ERROR pieces: the failure's kind (a probes.errors.Kind value); "" is stream_error.
    error_kind: str = ""


@dataclass
class Usage:
    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    service_tier: str = ""
    # The provider's own time for the request, as it reports it in the stream (Bedrock's
    # metrics.latencyMs); None when it reports none.
    server_ms: float | None = None
    # Output tokens of the answer alone, where the provider reports them apart (Gemini's
    # candidatesTokenCount); speed over multi-token chunks reads it.
    answer_tokens: int | None = None


class Framing(Protocol):
    """Turns a response body's bytes into events, as they arrive (SSE, AWS event-stream)."""

    foreign: str | None  # the first line that is no event at all (an HTML page)

    def feed(self, chunk: bytes) -> list[Event]: ...

    def close(self) -> list[Event]: ...


@dataclass
class Served:
    """What served the probe, as the response says."""

    model: str = ""
    response_id: str = ""
    service_tier: str = ""


def count(value: Any) -> int | None:
    """A token count as a server reports it. Anything that is not one becomes unknown (None),
    not clamped: a negative, non-integral, NaN/inf or >2**31-1 "count" is not a real count
    (the database column is an integer). An integral float (12.0) is read as the integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            return None
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _label(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def error_message(text: str) -> tuple[str, str, str]:
    """(message, param, code) of an error body in any of the dialects' shapes; the text itself
    (whitespace collapsed) when it is not JSON."""
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split()), "", ""
    if not isinstance(data, dict):
        return " ".join(text.split()), "", ""
    err = data.get("error", data)
    if isinstance(err, str):
        return err, "", ""
    if not isinstance(err, dict):
        return " ".join(text.split()), "", ""
    message = err.get("message") or data.get("message") or data.get("detail") or text
    param, code = err.get("param"), err.get("code")
    return (
        str(message) if isinstance(message, str) else json.dumps(message),
        param if isinstance(param, str) else "",
        code if isinstance(code, str) else "",
    )


def merge_extra(
    body: dict[str, Any], spec: ProbeSpec, protected: frozenset[str] = PROTECTED_BODY_KEYS
) -> dict[str, Any]:
    clash = sorted(protected & set(spec.extra_body))
    if clash:
        raise InvalidSpec(
            f"extra_body may not set {', '.join(clash)}: the probe sets them (what it measures)"
        )
    body.update(spec.extra_body)
    return body


class WireFormat:
    name: ClassVar[str]
    # What the admin calls it (monitor.models.WIRE_FORMATS reads the registry's labels).
    label: ClassVar[str]
    path: ClassVar[str]
    # Whether the probe asks for usage in the stream (`stream_options`), and retries without
    # it when a server refuses it.
    sends_stream_options: ClassVar[bool] = False
    # The content type of a streamed response (a prefix of the header's value).
    content_type: ClassVar[str] = "text/event-stream"
    # Chunks carry many tokens each (Gemini): speed is the answer's tokens after its first
    # chunk over the time from that chunk to the last (figures.chunk_speed).
    multi_token_chunks: ClassVar[bool] = False

    def url(self, spec: ProbeSpec) -> str:
        return spec.base_url.rstrip("/") + self.path

    def framing(self, spec: ProbeSpec) -> Framing:
        """A new decoder of this format's stream framing, one per response."""
        return SSEParser(max_line_bytes=spec.max_line_bytes)

    def reader(self) -> Callable[[Event], list[Piece]]:
        """The parse function for one response: formats that check the stream as a whole
        (Responses' sequence numbers) return one with its own state."""
        return self.parse

    def sign(self, spec: ProbeSpec, url: str, headers: dict[str, str], body: bytes) -> None:
        """Add request authentication computed over the final request (SigV4), in place."""

    def headers(self, spec: ProbeSpec) -> dict[str, str]:
        raise NotImplementedError

    def body(self, spec: ProbeSpec, prompt: Prompt, stream_options: bool) -> dict[str, Any]:
        """The request body, settings included, extra_body merged last. InvalidSpec for
        settings this format cannot send."""
        raise NotImplementedError

    def parse(self, event: Event) -> list[Piece]:
        raise NotImplementedError

    def usage(self, raw: dict[str, Any]) -> Usage:
        raise NotImplementedError

    def served(self, metas: Sequence[Mapping[str, Any]]) -> Served:
        """What served the probe, from the objects the USAGE and FINISH pieces carried: the
        first non-empty value of each (Azure's first chunk says model "")."""
        served = Served()
        for meta in metas:
            served.model = served.model or _label(meta.get("model"), 200)
            served.response_id = served.response_id or _label(meta.get("id"), 100)
            served.service_tier = served.service_tier or _label(meta.get("service_tier"), 30)
        return served

    def refusal(self, status: int, text: str, sent: Mapping[str, Any]) -> RefusedParameter | None:
        """A 400 (or 422) refusing one of the request settings we sent: the route's settings
        are wrong for this model, which is ours to fix, not the provider's failure."""
        if status not in (400, 422):
            return None
        message, param, code = error_message(text)
        named, verb = "", _NOT_SUPPORTED
        if param and code in _REFUSING_CODES:
            named, verb = param, _BAD_VALUE if code == "unsupported_value" else _NOT_SUPPORTED
        else:
            for pattern, says in _REFUSALS:
                found = pattern.search(message)
                if found:
                    named, verb = found.group(1), says
                    break
        if not named or named.split(".")[0] not in sent or named in _NOT_SETTINGS:
            return None
        detail = f"the route's request settings are wrong for this model: {named!r} {verb}"
        instead = _INSTEAD.search(message)
        if instead:
            detail += f", use {instead.group(1)!r}"
        elif named in TOKEN_LIMIT_PARAMS:
            other = next(p for p in TOKEN_LIMIT_PARAMS if p != named)
            detail += f", try {other!r}"
        return RefusedParameter(f"{detail} (HTTP {status}: {message})", named)

    @staticmethod
    def _json(data: str) -> dict[str, Any]:
        # json.loads' own C scanner, called directly: json.loads wraps it in two Python calls
        # and two regex matches for the whitespace around the value, a third of its cost on a
        # chunk (bench/bench_probes.py). What it reads and refuses is json.loads' (the fuzz test
        # in tests/probes/test_parsers_fuzz.py holds it to that). Not orjson: it reads integers
        # past 64 bits as floats, which would turn a usage count into "unknown".
        text = data.strip(_JSON_SPACE)
        try:
            value, end = _scan_json(text, 0)
        except (StopIteration, ValueError):  # StopIteration: no JSON value at all
            raise MalformedStream(f"event data is not JSON: {data[:80]!r}") from None
        if end != len(text):  # json.loads' "Extra data"
            raise MalformedStream(f"event data is not JSON: {data[:80]!r}")
        if not isinstance(value, dict):
            raise MalformedStream("event data is not a JSON object")
        return value
