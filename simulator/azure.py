"""Azure OpenAI's Chat Completions behind a resource's deployment URLs, as the simulator speaks
it."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from simulator.chat import Frames, OpenAIChat
from simulator.wire import Endpoint, HttpError, StreamContext, _dumps, _js

_SAFE = {"filtered": False, "severity": "safe"}
# Azure's default content filter verdicts on a harmless prompt and completion.
PROMPT_FILTER_RESULTS = {
    "hate": _SAFE,
    "jailbreak": {"filtered": False, "detected": False},
    "self_harm": _SAFE,
    "sexual": _SAFE,
    "violence": _SAFE,
}
CONTENT_FILTER_RESULTS = {"hate": _SAFE, "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE}
AZURE_DEPLOYMENT = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")
AZURE_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")


class AzureChat(OpenAIChat):
    """Azure OpenAI: the OpenAI Chat Completions wire format behind an Azure resource's URLs
    (/openai/deployments/<deployment>/chat/completions?api-version=YYYY-MM-DD), the api-key
    header, Azure's own error shapes for routing and auth, and content filter results: a
    first chunk with no choices carrying prompt_filter_results, content_filter_results on
    every choice after it."""

    name = "azure"
    path = "/openai/deployments/{deployment}/chat/completions"

    def endpoint(self, method: str, path: str) -> Endpoint:
        match = AZURE_DEPLOYMENT.match(path)
        if match is None:
            raise self._not_found()
        if method != "POST":
            raise HttpError(405, f"Method {method} not allowed on {path}")
        return Endpoint("generate", model=match.group(1))

    def check_query(self, query: str) -> None:
        versions = [
            v for k, _, v in (p.partition("=") for p in query.split("&")) if k == "api-version"
        ]
        if not versions or not versions[0]:
            raise self._not_found()
        if not AZURE_API_VERSION.match(versions[0]):
            raise HttpError(
                400,
                "API version not supported",
                body={"error": {"code": "BadRequest", "message": "API version not supported"}},
            )

    @staticmethod
    def _not_found() -> HttpError:
        return HttpError(
            404,
            "Resource not found",
            body={"error": {"code": "404", "message": "Resource not found"}},
        )

    def api_key(self, headers: dict[str, str]) -> str:
        return headers.get("api-key", "").strip()

    def unauthorized(self) -> HttpError:
        message = (
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
            "provide a valid key for an active subscription and use a correct regional API "
            "endpoint for your resource."
        )
        return HttpError(401, message, body={"error": {"code": "401", "message": message}})

    def model_not_found(self, model: object) -> HttpError:
        message = (
            "The API deployment for this resource does not exist. If you created the deployment "
            "within the last 5 minutes, please wait a moment and try again."
        )
        return HttpError(
            404, message, body={"error": {"code": "DeploymentNotFound", "message": message}}
        )

    def error_body(self, err: HttpError) -> bytes:
        if err.body is None and (err.status == 429 or err.status >= 500):
            return _dumps({"error": {"code": str(err.status), "message": err.message}})
        return super().error_body(err)

    def response_headers(self, request_id: str) -> list[tuple[str, str]]:
        return [("apim-request-id", request_id), ("x-request-id", request_id)]

    def _choice(self, ctx: StreamContext) -> dict[str, Any]:
        return {"content_filter_results": CONTENT_FILTER_RESULTS, **super()._choice(ctx)}

    def whole_body(self, ctx: StreamContext) -> bytes:
        data = json.loads(super().whole_body(ctx))
        data["prompt_filter_results"] = [
            {"prompt_index": 0, "content_filter_results": PROMPT_FILTER_RESULTS}
        ]
        return _dumps(data)

    def _frames(self, ctx: StreamContext) -> Frames:
        usage_null = b',"usage":null' if ctx.include_usage else b""
        tail = (
            b'"created":'
            + str(int(time.time())).encode()
            + b',"id":"chatcmpl-'
            + ctx.request_id.encode()
            + b'","model":'
            + _js(ctx.model)
            + b',"object":"chat.completion.chunk","system_fingerprint":"fp_sim"'
        )
        filters = _dumps(CONTENT_FILTER_RESULTS)

        def chunk(results: bytes, delta: bytes, finish: bytes) -> bytes:
            return (
                b'data: {"choices":[{"content_filter_results":'
                + results
                + b',"delta":'
                + delta
                + b',"finish_reason":'
                + finish
                + b',"index":0,"logprobs":null}],'
                + tail
                + usage_null
                + b"}\n\n"
            )

        prompt_filter = _dumps(
            {
                "choices": [],
                "created": 0,
                "id": "",
                "model": "",
                "object": "",
                "prompt_filter_results": [
                    {"prompt_index": 0, "content_filter_results": PROMPT_FILTER_RESULTS}
                ],
            }
        )
        before, after = chunk(filters, b"\x00", b"null").split(b"\x00")
        return Frames(
            opening=b"data: "
            + prompt_filter
            + b"\n\n"
            + chunk(b"{}", b'{"content":"","refusal":null,"role":"assistant"}', b"null"),
            before=before,
            after=after,
            final=chunk(b"{}", b"{}", _js(ctx.plan.finish_reason)),
            usage_head=b'data: {"choices":[],' + tail + b',"usage":',
            usage_tail=b"}\n\n",
        )
