"""Amazon Bedrock's Converse API, as the simulator speaks it.

    POST /<slug>/model/<model id, percent-encoded>/converse-stream   (AWS event-stream)
    POST /<slug>/model/<model id, percent-encoded>/converse          (whole JSON)

Requests are authenticated as Bedrock does: SigV4 for the `bedrock` service in the provider's
region, verified with botocore's own signer over the request as received (the canonical URI
is the path encoded once more, so a model id's `%3A` is signed as `%253A`); or a Bedrock API
key as a bearer token. A bad signature is answered 403 with `x-amzn-ErrorType:
InvalidSignatureException` and `{"message": ...}`, an unknown access key 403
UnrecognizedClientException, a date more than 15 minutes off 403 "Signature expired".

The stream is binary event-stream messages (prelude, string headers, JSON payload, two
CRC32s): messageStart, contentBlockDelta (reasoningContent, then text, each payload padded with
a `p` field), contentBlockStop, messageStop, metadata (usage with inputTokens excluding cache
reads and writes, metrics.latencyMs, serviceTier). Exceptions mid-stream are messages of type
`exception`. Sources: simulator/README.md.
"""

from __future__ import annotations

import binascii
import hmac
import re
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import unquote

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from simulator.config import Provider
from simulator.wire import (
    END,
    FRAME,
    REASONING,
    Endpoint,
    HttpError,
    Limits,
    Prompt,
    Step,
    StreamContext,
    WireFormat,
    _dumps,
)

_ENDPOINT = re.compile(r"^/model/([^/]+)/(converse-stream|converse)$")
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
    r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$"
)
MAX_SKEW_S = 15 * 60
_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    413: "ValidationException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
_PAD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details."
)


def message(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message: headers as strings (type 7), checked by CRC32s."""
    head = b"".join(
        struct.pack("B", len(n)) + n.encode() + b"\x07" + struct.pack(">H", len(v)) + v.encode()
        for n, v in headers
    )
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", binascii.crc32(body))


def event(kind: str, data: dict[str, Any]) -> bytes:
    headers = [
        (":event-type", kind),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ]
    return message(headers, _dumps(data))


def exception(kind: str, text: str) -> bytes:
    headers = [
        (":exception-type", kind),
        (":content-type", "application/json"),
        (":message-type", "exception"),
    ]
    return message(headers, _dumps({"message": text}))


class BedrockConverse(WireFormat):
    name = "bedrock"
    path = "/model/{modelId}/converse-stream"
    models_path = "/foundation-models"  # served by the control plane, not bedrock-runtime
    explicit_cache = True  # caching only at cachePoint blocks
    stream_content_type = "application/vnd.amazon.eventstream"
    _stop: ClassVar[dict[str, str]] = {"stop": "end_turn", "length": "max_tokens"}

    def endpoint(self, method: str, path: str) -> Endpoint:
        match = _ENDPOINT.match(path)
        if match is None:
            raise HttpError(404, "Not Found", code="UnknownOperationException")
        if method != "POST":
            raise HttpError(405, f"Method {method} not allowed on {path}")
        stream = match.group(2) == "converse-stream"
        return Endpoint("generate", model=unquote(match.group(1)), stream=stream)

    def authenticate(self, provider: Provider, request: Any) -> None:
        headers = request.headers
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer "):
            if auth.removeprefix("Bearer ").strip() not in provider.api_keys:
                raise _denied("UnrecognizedClientException", "Invalid API Key format or value.")
            return
        if not auth:
            raise _denied("MissingAuthenticationTokenException", "Missing Authentication Token")
        found = _AUTH.match(auth)
        if found is None:
            raise _denied("IncompleteSignatureException", "Authorization header is malformed.")
        key_id, day, region, service, signed, signature = found.groups()
        secret = provider.aws_keys.get(key_id)
        if secret is None:
            raise _denied(
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        if region != provider.region or service != "bedrock":
            raise _denied(
                "InvalidSignatureException",
                f"Credential should be scoped to a valid region and service: '{provider.region}', 'bedrock'.",
            )
        stamp = headers.get("x-amz-date", "")
        try:
            sent = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            raise _denied(
                "IncompleteSignatureException",
                "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
            ) from None
        if abs(time.time() - sent.timestamp()) > MAX_SKEW_S or day != stamp[:8]:
            raise _denied(
                "InvalidSignatureException", f"Signature expired: {stamp} is now out of range."
            )
        forced = headers.get("x-sim-fault", "") if provider.allow_fault_header else ""
        if "bad_signature" in forced:
            secret += "-not-the-one-signed-with"
        names = signed.split(";")
        if "host" not in names or any(n not in headers for n in names):
            raise _denied("InvalidSignatureException", BAD_SIGNATURE)
        # The request as received, with only the headers the client signed: botocore computes
        # what the signature must be (the same code the AWS SDKs sign with).
        aws = AWSRequest(
            method=request.method,
            url=f"https://{headers['host']}{request.path}"
            + (f"?{request.query}" if request.query else ""),
            data=request.body,
            headers={n: headers[n] for n in names},
        )
        aws.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(key_id, secret), service, region)
        expected = signer.signature(signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
        if not hmac.compare_digest(expected, signature):
            raise _denied("InvalidSignatureException", BAD_SIGNATURE)

    def api_key(self, headers: dict[str, str]) -> str:
        return headers.get("authorization", "").removeprefix("Bearer ").strip()

    def model_not_found(self, model: object) -> HttpError:
        return HttpError(
            400, "The provided model identifier is invalid.", code="ValidationException"
        )

    def invalid_body(self, detail: str) -> HttpError:
        return HttpError(400, "Malformed input request, please reformat your input and try again.")

    def error_body(self, err: HttpError) -> bytes:
        return _dumps(err.body if err.body is not None else {"message": err.message})

    def error_headers(self, err: HttpError) -> list[tuple[str, str]]:
        kind = (
            err.code
            if err.code and err.code[0].isupper()
            else _TYPES.get(err.status, "InternalServerException")
        )
        return [
            ("x-amzn-ErrorType", f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/")
        ]

    def response_headers(self, request_id: str) -> list[tuple[str, str]]:
        return [("x-amzn-RequestId", request_id)]

    def limit_headers(self, limits: Limits) -> list[tuple[str, str]]:
        return []  # Bedrock sends no rate-limit headers

    def check_body(self, body: dict[str, Any]) -> None:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HttpError(
                400,
                "1 validation error detected: Value at 'messages' failed to satisfy constraint: "
                "Member must not be null",
            )

    def prompt(self, body: dict[str, Any]) -> Prompt:
        """Text blocks in the order Bedrock renders them (system, then messages); a cachePoint
        block marks everything before it as a cacheable prefix."""
        parts: list[str] = []
        breakpoints: list[tuple[int, float]] = []
        contents = [body.get("system")]
        contents += [m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)]
        for content in contents:
            for block in content if isinstance(content, list) else []:
                if not isinstance(block, dict):
                    continue
                if isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif "cachePoint" in block and parts:
                    breakpoints.append((len(parts) - 1, 300.0))
        return Prompt(parts, breakpoints)

    def models_body(self, provider: Provider) -> bytes:
        return _dumps({"modelSummaries": [{"modelId": m} for m in provider.models]})

    @staticmethod
    def usage(ctx: StreamContext) -> dict[str, Any]:
        plan = ctx.plan
        read, written = plan.cached_tokens, plan.cache_creation_tokens
        usage: dict[str, Any] = {
            "inputTokens": plan.input_tokens - read - written,
            "outputTokens": plan.output_tokens,
            "totalTokens": plan.input_tokens + plan.output_tokens,
        }
        if read or written:
            usage["cacheReadInputTokens"] = read
            usage["cacheWriteInputTokens"] = written
        return usage

    def _metadata(self, ctx: StreamContext) -> dict[str, Any]:
        latency_ms = round((time.perf_counter() - ctx.base_at) * 1000)
        ctx.server_ms = float(latency_ms)
        data: dict[str, Any] = {"metrics": {"latencyMs": latency_ms}}
        if "no_usage" not in ctx.faults:
            data["usage"] = self.usage(ctx)
        data["serviceTier"] = {"type": ctx.plan.service_tier or "default"}
        if ctx.options.get("latency") == "optimized":
            data["performanceConfig"] = {"latency": "optimized"}
        data["p"] = _PAD[:12]
        return data

    def whole_body(self, ctx: StreamContext) -> bytes:
        plan = ctx.plan
        content: list[dict[str, Any]] = []
        if plan.reasoning:
            text = "".join(plan.reasoning)
            content.append(
                {"reasoningContent": {"reasoningText": {"text": text, "signature": "sim"}}}
            )
        content.append({"text": "".join(plan.answer)})
        data = self._metadata(ctx)
        data.pop("p")
        data["output"] = {"message": {"role": "assistant", "content": content}}
        data["stopReason"] = self._stop[plan.finish_reason]
        return _dumps(data)

    def steps(self, ctx: StreamContext) -> Iterator[Step]:
        plan = ctx.plan
        yield None, event("messageStart", {"p": _PAD[:8], "role": "assistant"}), FRAME
        index, text_started = 0, False
        malformed_at = ctx.malformed_at
        for i, at, text, kind in ctx.pieces():
            before = b""
            if i == malformed_at:
                broken = bytearray(event("contentBlockDelta", {"delta": {"text": "oops"}}))
                broken[-1] ^= 0xFF  # the message CRC no longer matches
                before = bytes(broken)
            if kind == REASONING:
                delta: dict[str, Any] = {"reasoningContent": {"text": text}}
            else:
                if not text_started:
                    text_started = True
                    if plan.reasoning:
                        before += self._close_reasoning(ctx)
                        index = 1
                delta = {"text": text}
            data = {"contentBlockIndex": index, "delta": delta, "p": _PAD[: 1 + i % 20]}
            yield at, before + event("contentBlockDelta", data), kind
        if ctx.cut is not None:
            if "stream_error" in ctx.faults:
                yield None, self.stream_error(), FRAME
                yield None, b"", END
            elif "stream_throttled" in ctx.faults:
                yield None, self.stream_throttled(), FRAME
                yield None, b"", END
            else:
                yield from self._cut_steps(ctx)
            return
        closing = b"" if text_started else self._close_reasoning(ctx)
        if text_started:
            closing += event("contentBlockStop", {"contentBlockIndex": index, "p": _PAD[:4]})
        closing += event(
            "messageStop", {"p": _PAD[:6], "stopReason": self._stop[plan.finish_reason]}
        )
        end_at = ctx.base_at + plan.end_s if not plan.answer else None
        yield end_at, closing, FRAME
        # Rendered once the stop went out (the player asks for the next step after sending):
        # latencyMs is the time until then.
        yield None, event("metadata", self._metadata(ctx)), FRAME
        yield None, b"", END

    @staticmethod
    def _close_reasoning(ctx: StreamContext) -> bytes:
        if not ctx.plan.reasoning:
            return b""
        signature = {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "sim"}}}
        return event("contentBlockDelta", signature) + event(
            "contentBlockStop", {"contentBlockIndex": 0}
        )

    def huge_chunk(self) -> bytes:
        return event(
            "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " the" * 8000}}
        )

    def stream_error(self) -> bytes:
        return exception(
            "modelStreamErrorException",
            "The model encountered an error processing the stream. Try your request again.",
        )

    def stream_throttled(self) -> bytes:
        return exception(
            "throttlingException", "Too many requests, please wait before trying again."
        )


def _denied(kind: str, text: str) -> HttpError:
    return HttpError(403, text, code=kind)
