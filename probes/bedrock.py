"""Amazon Bedrock ConverseStream (`POST {base}/model/{modelId}/converse-stream`).

What the format relies on, from the Bedrock API reference (`ConverseStream`,
`ConverseStreamOutput`, `ConverseStreamMetadataEvent`, `TokenUsage`), AWS's "Event stream
encoding" and "Signature Version 4" pages, and botocore's code:
- The base is `https://bedrock-runtime.{region}.amazonaws.com`. The model id (a model, an
  inference profile such as `us.anthropic...`, or an ARN) is one path segment: its `:` and `/`
  are percent-encoded in the URL, and SigV4's canonical URI encodes the path once more
  (`%3A` becomes `%253A`), as botocore's SigV4Auth does for every service but S3.
- Authentication is SigV4 for the `bedrock` service (botocore's SigV4Auth over an AWSRequest,
  signed as the last step of preparing the request), or a Bedrock API key sent as a bearer
  token.
- The response is `application/vnd.amazon.eventstream`: binary messages, each with a prelude,
  headers and payload, checked by two CRC32s. botocore's EventStreamBuffer decodes them (a CRC
  mismatch is a malformed stream). `:message-type` is `event` (`:event-type` messageStart,
  contentBlockStart, contentBlockDelta, contentBlockStop, messageStop, metadata), `exception`
  (`:exception-type` internalServerException, modelStreamErrorException, validationException,
  throttlingException, serviceUnavailableException) or `error`.
- contentBlockDelta's delta holds `text` (the answer), `reasoningContent.text` (reasoning;
  `signature` and `redactedContent` carry none), or `toolUse.input`. Payloads carry a `p`
  padding field, which is not output.
- metadata comes last: `usage` (`inputTokens` excludes cache reads and writes, which come as
  `cacheReadInputTokens` and `cacheWriteInputTokens`; `outputTokens` includes reasoning),
  `metrics.latencyMs` (Bedrock's own time for the request), `serviceTier.type`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote, urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer, ParserError

from probes.errors import InvalidSpec, Kind, MalformedStream
from probes.model import BODY_JSON, MAX_TOKENS, ProbeSpec
from probes.prompts import Prompt
from probes.sse import Event
from probes.wire import (
    ANSWER,
    DONE,
    ERROR,
    FINISH,
    REASONING,
    TOOL,
    USAGE,
    Framing,
    Piece,
    Served,
    Usage,
    WireFormat,
    _label,
    count,
    merge_extra,
)

CONTENT_TYPE = "application/vnd.amazon.eventstream"
SIGNING_NAME = "bedrock"
_REGION_IN_HOST = re.compile(r"^bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")
PROTECTED = frozenset({"messages", "system", "inferenceConfig"})
# In-stream exceptions with a kind of their own: a rate limit is one wherever it arrives; the
# others (internalServerException, serviceUnavailableException, validationException,
# modelStreamErrorException) came after the stream began: stream_error.
EXCEPTION_KINDS = {"throttlingException": Kind.HTTP_429}


class EventStreamFraming:
    """AWS event-stream messages as Events, decoded by botocore (CRCs checked). Messages
    decoded before a corrupt one in the same read still count (they arrived intact); the
    corruption is raised on the next call."""

    foreign: str | None = None

    def __init__(self) -> None:
        self.buffer = EventStreamBuffer()
        self.failure: MalformedStream | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        if self.failure is not None:
            raise self.failure
        self.buffer.add_data(chunk)
        events: list[Event] = []
        try:
            for message in self.buffer:
                headers = cast("dict[str, Any]", message.headers)
                kind = headers.get(":message-type")
                payload = message.payload.decode("utf-8", errors="replace")
                if kind == "event":
                    events.append(Event(event=str(headers.get(":event-type", "")), data=payload))
                elif kind == "exception":
                    name = str(headers.get(":exception-type", "exception"))
                    events.append(Event(event=name, data=payload, exception=True))
                elif kind == "error":
                    code = str(headers.get(":error-code", "error"))
                    text = json.dumps({"message": str(headers.get(":error-message", ""))})
                    events.append(Event(event=code, data=text, exception=True))
                else:
                    raise MalformedStream(f"an event-stream message of type {kind!r}")
        except ParserError as exc:
            self.failure = MalformedStream(
                f"the event stream is corrupt: {exc.__class__.__name__}: {exc}"
            )
            if not events:
                raise self.failure from None
        return events

    def close(self) -> list[Event]:
        if self.failure is not None:
            raise self.failure
        return []  # a partial message left over: the stream ended before it (truncated)


class BedrockConverse(WireFormat):
    name = "bedrock"
    label = "Amazon Bedrock ConverseStream (SigV4 or a Bedrock API key)"
    path = "/converse-stream"
    content_type = CONTENT_TYPE

    def url(self, spec: ProbeSpec) -> str:
        return f"{spec.base_url.rstrip('/')}/model/{quote(spec.model, safe='')}{self.path}"

    def framing(self, spec: ProbeSpec) -> Framing:
        return EventStreamFraming()

    def headers(self, spec: ProbeSpec) -> dict[str, str]:
        return {"authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}

    def sign(self, spec: ProbeSpec, url: str, headers: dict[str, str], body: bytes) -> None:
        if spec.api_key:
            return  # a Bedrock API key: the bearer token is the authentication
        if not (spec.aws_access_key_id and spec.aws_secret_access_key):
            raise InvalidSpec("Bedrock needs an API key, or an access key id and secret access key")
        region = spec.aws_region or _region_of(url)
        if not region:
            raise InvalidSpec("Bedrock needs a region to sign requests (the provider's region)")
        # Signed: the host (botocore takes it from the URL, as the client sends it), the
        # content type and the date; other headers may be changed by proxies on the way.
        request = AWSRequest(
            method="POST", url=url, data=body, headers={"content-type": headers["content-type"]}
        )
        credentials = Credentials(
            spec.aws_access_key_id, spec.aws_secret_access_key, spec.aws_session_token or None
        )
        SigV4Auth(credentials, SIGNING_NAME, region).add_auth(request)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in request.headers:
                headers[name.lower()] = request.headers[name]

    def body(self, spec: ProbeSpec, prompt: Prompt, stream_options: bool) -> dict[str, Any]:
        if spec.token_limit_param != MAX_TOKENS:
            raise InvalidSpec("Bedrock takes its output cap as inferenceConfig.maxTokens")
        if spec.body_encoding != BODY_JSON:
            raise InvalidSpec("Bedrock takes JSON bodies only")
        if spec.reasoning_effort:
            raise InvalidSpec(
                "Bedrock's Converse API has no reasoning_effort: set the model's own field in "
                "extra_body additionalModelRequestFields, or thinking_budget_tokens for Claude"
            )
        inference: dict[str, Any] = {"maxTokens": spec.max_tokens}
        if spec.temperature is not None:
            inference["temperature"] = spec.temperature
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": [{"text": prompt.question}]}],
        }
        stable = "\n\n".join(p for p in (prompt.system, prompt.document.rstrip()) if p)
        if prompt.head or stable:
            system: list[dict[str, Any]] = [{"text": prompt.head + stable}]
            if stable and not spec.fresh_prefix:  # cache the stable prefix
                system.append({"cachePoint": {"type": "default"}})
            body["system"] = system
        body["inferenceConfig"] = inference
        if spec.thinking_budget_tokens is not None:
            if spec.thinking_budget_tokens >= spec.max_tokens:
                raise InvalidSpec(
                    f"max_tokens ({spec.max_tokens}) must exceed thinking_budget_tokens "
                    f"({spec.thinking_budget_tokens}): thinking counts within max_tokens"
                )
            body["additionalModelRequestFields"] = {
                "thinking": {"type": "enabled", "budget_tokens": spec.thinking_budget_tokens}
            }
        if spec.service_tier:
            body["serviceTier"] = {"type": spec.service_tier}
        return merge_extra(body, spec, PROTECTED)

    def parse(self, event: Event) -> list[Piece]:
        if event.exception:
            data = _object(event.data)
            message = _label(data.get("message") or data.get("Message"), 300)
            kind = EXCEPTION_KINDS.get(event.event, Kind.STREAM_ERROR)
            return [Piece(ERROR, f"{event.event}: {message}".rstrip(": "), error_kind=kind)]
        name = event.event
        if name == "contentBlockDelta":
            delta = self._json(event.data).get("delta")
            if not isinstance(delta, dict):
                raise MalformedStream("contentBlockDelta without a delta")
            text = delta.get("text")
            if isinstance(text, str):
                return [Piece(ANSWER, text)] if text else []
            reasoning = delta.get("reasoningContent")
            if isinstance(reasoning, dict):
                thought = reasoning.get("text")
                return [Piece(REASONING, thought)] if isinstance(thought, str) and thought else []
            tool = delta.get("toolUse")
            if isinstance(tool, dict) and tool.get("input"):
                return [Piece(TOOL, str(tool["input"]))]
            return []
        if name == "messageStop":
            data = self._json(event.data)
            return [Piece(FINISH, _label(data.get("stopReason"), 40) or "stop", meta=data)]
        if name == "metadata":
            data = self._json(event.data)
            usage = data.get("usage")
            flat = dict(usage) if isinstance(usage, dict) else {}
            metrics = data.get("metrics")
            if isinstance(metrics, dict) and "latencyMs" in metrics:
                flat["latencyMs"] = metrics["latencyMs"]
            tier = data.get("serviceTier")
            if isinstance(tier, dict) and isinstance(tier.get("type"), str):
                flat["serviceTier"] = tier["type"]
            return [Piece(USAGE, usage=flat or None, meta=data), Piece(DONE)]
        return []  # messageStart, contentBlockStart/Stop and future events

    def usage(self, raw: dict[str, Any]) -> Usage:
        read = count(raw.get("cacheReadInputTokens"))
        written = count(raw.get("cacheWriteInputTokens")) or 0
        uncached = count(raw.get("inputTokens"))
        latency = count(raw.get("latencyMs"))
        return Usage(
            input_tokens=None if uncached is None else count(uncached + (read or 0) + written),
            cached_tokens=read,
            output_tokens=count(raw.get("outputTokens")),
            service_tier=_label(raw.get("serviceTier"), 30),
            server_ms=None if latency is None else float(latency),
        )

    def served(self, metas: Sequence[Mapping[str, Any]]) -> Served:
        served = Served()
        for meta in metas:
            tier = meta.get("serviceTier")
            if not served.service_tier and isinstance(tier, dict):
                served.service_tier = _label(tier.get("type"), 30)
        return served


def _region_of(url: str) -> str:
    found = _REGION_IN_HOST.match(urlsplit(url).hostname or "")
    return found.group(1) if found else ""


def _object(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {"message": data}
    return value if isinstance(value, dict) else {"message": str(value)}
