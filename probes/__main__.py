"""python -m probes --url BASE --format openai|anthropic --model M [options]

Without --json: a readable summary with p50/p95/p99 (and a progress bar for long runs).
With --json: one JSON object per probe, field names as in the metric table.
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
from probes.model import BODY_JSON, BODY_MSGPACK_GZIP, ProbeResult, ProbeSpec
from probes.transport import warm_clients


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _fmt(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:,.1f} {unit}"


def summary(results: Sequence[ProbeResult]) -> str:
    ok = [r for r in results if r.ok]
    lines = [f"{len(ok)}/{len(results)} ok"]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    if errors:
        lines.append("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())))
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
        lines.append(
            f"{last.http_version}, output tokens {last.output_tokens} ({last.token_source}), "
            f"input {last.input_tokens}, cached {last.cached_tokens if last.cached_tokens is not None else 'not reported'}"
        )
    return "\n".join(lines)


async def _run(ns: argparse.Namespace, api_key: str) -> list[ProbeResult]:
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
    )
    results: list[ProbeResult] = []
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probes", description="Probe an LLM API route.")
    parser.add_argument(
        "--url", required=True, help="base URL (…/v1 for OpenAI, before /v1 for Anthropic)"
    )
    parser.add_argument("--format", required=True, choices=["openai", "anthropic"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-env", default=None, help="environment variable holding the key")
    parser.add_argument("--http2", action="store_true")
    parser.add_argument("--body", choices=[BODY_JSON, BODY_MSGPACK_GZIP], default=BODY_JSON)
    parser.add_argument("--cold", action="store_true", help="a new connection for every probe")
    parser.add_argument("--fresh-prefix", action="store_true", help="defeat prompt caches")
    parser.add_argument("--input-tokens", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt", default="Write two sentences about latency.")
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
    ns = parser.parse_args(argv)
    if ns.count < 1 or ns.concurrency < 1:
        parser.error("--count and --concurrency must be at least 1")
    api_key = ""
    if ns.api_key_env:
        api_key = os.environ.get(ns.api_key_env, "")
        if not api_key:
            parser.error(f"environment variable {ns.api_key_env} is empty or unset")
    results = asyncio.run(_run(ns, api_key))
    if not ns.json:
        print(summary(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
