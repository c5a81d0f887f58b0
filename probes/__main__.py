"""python -m probes --url BASE --format openai|azure|anthropic|responses|gemini|bedrock --model M

Without --json: a readable summary with p50/p95/p99 (and a progress bar for long runs).
With --json: one JSON object per probe, field names as in the metric table.
Keys and secret headers come from environment variables, never from the command line (where
`ps` and shell histories would show them). Bedrock signs with SigV4 from AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) unless --api-key-env names a Bedrock API key.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence

from probes.batch import run_batch
from probes.errors import Kind
from probes.formats import WIRE_FORMATS
from probes.model import BODY_ENCODINGS, BODY_JSON, TOKEN_LIMIT_PARAMS, Measurement, ProbeSpec
from probes.transport import warm_clients

_KINDS = {k.value: k for k in Kind}


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _fmt(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:,.1f} {unit}"


def summary(results: Sequence[Measurement]) -> str:
    ok = [r for r in results if r.ok]
    lines = [f"{len(ok)}/{len(results)} ok"]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    if errors:
        lines.append("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())))
        for kind in sorted(errors):
            about = _KINDS.get(kind)
            if about is not None:
                lines.append(f"  {kind} ({about.blame}): {about.meaning}")
        last_error = next(r for r in reversed(results) if not r.ok)
        lines.append(f"  last: {last_error.error_detail}")
    lines.append(f"{'':14}{'p50':>14}{'p95':>14}{'p99':>14}")
    for label, attr, unit in [
        ("TTFB", "ttfb_ms", "ms"),
        ("TTFT", "ttft_ms", "ms"),
        ("TTFAT", "ttfat_ms", "ms"),
        ("e2e", "e2e_ms", "ms"),
        ("speed", "tps", "tok/s"),
        ("ITL p50", "itl_p50_ms", "ms"),
    ]:
        values = [getattr(r, attr) for r in ok if getattr(r, attr) is not None]
        row = "".join(f"{_fmt(_percentile(values, q), unit):>14}" for q in (0.5, 0.95, 0.99))
        lines.append(f"{label:14}{row}")
    if ok:
        last = ok[-1]
        cached = last.cached_tokens if last.cached_tokens is not None else "not reported"
        reused = {True: "reused", False: "new", None: "?"}[last.connection_reused]
        lines.append(
            f"{last.http_version} ({reused} connection), output tokens {last.output_tokens} "
            f"({last.token_source}), speed counted from {last.streamed_output_tokens} streamed "
            f"({last.tps_token_source}), input {last.input_tokens}, cached {cached}"
        )
        if last.server_ms is not None and last.e2e_ms is not None:
            lines.append(
                f"provider's own time {last.server_ms:,.0f} ms of e2e {last.e2e_ms:,.0f} ms"
            )
        if last.reasoning_tokens:
            lines.append(
                f"reasoning tokens {last.reasoning_tokens}, hidden {last.hidden_reasoning_tokens}"
            )
        lines.append(
            f"served by {last.served_model or '?'}, tier {last.service_tier or '?'}, "
            f"request {last.request_id or '?'}"
        )
    return "\n".join(lines)


async def _run(
    ns: argparse.Namespace, api_key: str, secret_headers: dict[str, str], aws: dict[str, str]
) -> list[Measurement]:
    spec = ProbeSpec(
        base_url=ns.url,
        format=ns.format,
        model=ns.model,
        api_key=api_key,
        user_prompt=ns.prompt,
        input_tokens=ns.input_tokens,
        max_tokens=ns.max_tokens,
        http2=ns.http2,
        body_encoding=ns.body,
        cold=ns.cold,
        fresh_prefix=ns.fresh_prefix,
        total_timeout_s=ns.timeout,
        first_token_timeout_s=min(ns.timeout, ns.first_token_timeout),
        verify=ns.ca or True,
        system_prompt=ns.system,
        token_limit_param=ns.token_limit_param,
        reasoning_effort=ns.reasoning_effort,
        thinking_budget_tokens=ns.thinking_budget,
        service_tier=ns.service_tier,
        temperature=ns.temperature,
        extra_body=ns.extra_body,
        api_version=ns.api_version,
        extra_headers=dict(ns.header),
        secret_headers=secret_headers,
        stream_options=ns.stream_options,
        aws_region=ns.aws_region or "",
        aws_access_key_id=aws.get("aws_access_key_id", ""),
        aws_secret_access_key=aws.get("aws_secret_access_key", ""),
        aws_session_token=aws.get("aws_session_token", ""),
    )
    results: list[Measurement] = []
    done = 0
    started = time.monotonic()

    async def progress_bar() -> None:
        while True:
            await asyncio.sleep(0.5)
            if (not ns.json and ns.count > 1 and sys.stderr.isatty()) or os.environ.get(
                "PROBES_PROGRESS"
            ):
                width = 30
                filled = int(width * done / ns.count)
                print(
                    f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{ns.count} "
                    f"{time.monotonic() - started:.0f}s",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )

    bar = asyncio.create_task(progress_bar())
    try:
        remaining = ns.count
        while remaining > 0:
            size = min(remaining, max(1, ns.concurrency))
            batch = await run_batch(
                [spec] * size, window_s=ns.window if size > 1 else 0, max_in_flight=ns.concurrency
            )
            for result in batch:
                if ns.json:
                    print(json.dumps(result.to_dict()), flush=True)
            results.extend(batch)
            done += len(batch)
            remaining -= size
    finally:
        bar.cancel()
        await warm_clients.aclose()
    if ns.count > 1 and not ns.json and sys.stderr.isatty():
        print(file=sys.stderr)
    return results


def _json_object(text: str) -> dict[str, object]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("use NAME:VALUE")
    return name.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.count < 1 or ns.concurrency < 1:
        parser.error("--count and --concurrency must be at least 1")
    api_key, secret_headers, aws = _secrets(parser, ns)
    results = asyncio.run(_run(ns, api_key, secret_headers, aws))
    if not ns.json:
        print(summary(results))
    return 0 if all(r.ok for r in results) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m probes", description="Probe an LLM API route.")
    parser.add_argument(
        "--url",
        required=True,
        help="base URL (…/v1 for OpenAI and Responses, before /v1 for Anthropic, the deployment "
        "URL for Azure, …/v1beta for Gemini, https://bedrock-runtime.REGION.amazonaws.com)",
    )
    parser.add_argument("--format", required=True, choices=sorted(WIRE_FORMATS))
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-env", default=None, help="environment variable holding the key")
    parser.add_argument("--http2", action="store_true")
    parser.add_argument("--body", choices=BODY_ENCODINGS, default=BODY_JSON)
    parser.add_argument("--cold", action="store_true", help="a new connection for every probe")
    parser.add_argument("--fresh-prefix", action="store_true", help="defeat prompt caches")
    parser.add_argument("--input-tokens", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=256, help="the output cap")
    parser.add_argument("--prompt", default="Write two sentences about latency.")
    parser.add_argument("--system", default="", help="system prompt")
    _add_request_settings(parser)
    parser.add_argument("-n", "--count", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--window",
        type=float,
        default=1.0,
        help="spread each batch's starts over this many seconds",
    )
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--first-token-timeout", type=float, default=60.0)
    parser.add_argument("--ca", help="CA bundle for TLS verification")
    parser.add_argument("--json", action="store_true", help="one JSON object per probe")
    return parser


def _add_request_settings(parser: argparse.ArgumentParser) -> None:
    """The options that change the request as a route's settings would."""
    settings = parser.add_argument_group("request settings (as the route would send them)")
    settings.add_argument(
        "--token-limit-param",
        choices=TOKEN_LIMIT_PARAMS,
        default="max_tokens",
        help="the name --max-tokens is sent under (OpenAI reasoning models: max_completion_tokens)",
    )
    settings.add_argument("--reasoning-effort", help="OpenAI formats: reasoning_effort")
    settings.add_argument(
        "--thinking-budget", type=int, help="Anthropic: extended thinking budget_tokens (>= 1024)"
    )
    settings.add_argument("--service-tier", help="sent as service_tier (auto, flex, priority...)")
    settings.add_argument("--temperature", type=float, help="not sent unless given")
    settings.add_argument(
        "--extra-body",
        type=_json_object,
        default={},
        help="JSON object merged into the body last (cannot set model, messages, stream)",
    )
    settings.add_argument("--api-version", help="Azure OpenAI: the api-version query parameter")
    settings.add_argument(
        "--aws-region", help="Bedrock: the region to sign for (default: from the URL's host)"
    )
    settings.add_argument(
        "--no-stream-options",
        dest="stream_options",
        action="store_false",
        help="OpenAI formats: do not ask for usage in the stream (some servers refuse it)",
    )
    settings.add_argument(
        "--header", type=_header, action="append", default=[], help="NAME:VALUE, repeatable"
    )
    settings.add_argument(
        "--secret-header-env",
        action="append",
        default=[],
        metavar="NAME:ENVVAR",
        help="a header whose value is read from an environment variable and never shown",
    )


def _secrets(
    parser: argparse.ArgumentParser, ns: argparse.Namespace
) -> tuple[str, dict[str, str], dict[str, str]]:
    """The key, the secret headers and Bedrock's AWS credentials, from environment variables
    only (a bad or missing one stops with the parser's error)."""
    api_key = ""
    if ns.api_key_env:
        api_key = os.environ.get(ns.api_key_env, "")
        if not api_key:
            parser.error(f"environment variable {ns.api_key_env} is empty or unset")
    secret_headers: dict[str, str] = {}
    for item in ns.secret_header_env:
        name, _, variable = item.partition(":")
        value = os.environ.get(variable.strip(), "") if name.strip() else ""
        if not value:
            parser.error(f"--secret-header-env {item!r}: use NAME:ENVVAR with ENVVAR set")
        secret_headers[name.strip()] = value
    aws: dict[str, str] = {}
    if ns.format == "bedrock" and not api_key:
        aws = {
            "aws_access_key_id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "aws_secret_access_key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "aws_session_token": os.environ.get("AWS_SESSION_TOKEN", ""),
        }
        if not (aws["aws_access_key_id"] and aws["aws_secret_access_key"]):
            parser.error(
                "bedrock: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or --api-key-env "
                "naming a Bedrock API key"
            )
    return api_key, secret_headers, aws


if __name__ == "__main__":
    sys.exit(main())
