"""manage.py import_prices: route prices from LiteLLM's price file, from a file or a URL."""

from __future__ import annotations

import http.server
import io
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from monitor.imports.base import ImportFileError
from monitor.imports.fetch import fetch
from monitor.models import ProbeResult, Provider, Route
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f

FIXTURE = Path(__file__).parent / "fixtures" / "model_prices_and_context_window.json"
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def _provider(slug: str, preset: str, base_url: str, wire: str = "openai") -> Provider:
    return Provider.objects.create(
        name=slug.title(), slug=slug, base_url=base_url, wire_format=wire, preset=preset
    )


@pytest.fixture
def routes(db: None) -> dict[str, Route]:
    openai = _provider("openai", "openai", "https://api.openai.com/v1")
    anthropic = _provider("anthropic", "anthropic", "https://api.anthropic.com", "anthropic")
    gemini = _provider(
        "gemini", "gemini", "https://generativelanguage.googleapis.com/v1beta/openai"
    )
    groq = _provider("groq", "groq", "https://api.groq.com/openai/v1")
    cerebras = _provider("cerebras", "cerebras", "https://api.cerebras.ai/v1")
    # Made by hand, no preset: known by its host all the same.
    deepseek = _provider("ds", "", "https://api.deepseek.com/v1")
    local = _provider("lab", "", "http://10.0.0.7:8000/v1")
    return {
        "mini": f.route(openai, "gpt-4o-mini"),
        "mini-priority": f.route(openai, "o4-mini", service_tier="priority"),
        "haiku": f.route(anthropic, "claude-haiku-4-5"),
        "flash": f.route(gemini, "gemini-2.5-flash"),
        "oss": f.route(groq, "openai/gpt-oss-20b"),
        "cerebras": f.route(cerebras, "llama3.1-8b"),
        # The same model id at another provider is another price: not OpenAI's.
        "groq-mini": f.route(groq, "gpt-4o-mini"),
        "deepseek": f.route(deepseek, "deepseek-chat"),
        "local": f.route(local, "gpt-4o-mini"),
    }


def _run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("import_prices", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _prices(route: Route) -> tuple[Decimal, Decimal, Decimal | None]:
    route.refresh_from_db()
    return (
        route.price_input_per_mtok,
        route.price_output_per_mtok,
        route.price_cached_input_per_mtok,
    )


def test_it_sets_input_output_and_cached_input_prices_per_million_tokens(routes) -> None:
    out, _ = _run(str(FIXTURE))
    # gpt-4o-mini: 1.5e-07, 6e-07, cache read 7.5e-08 per token
    assert _prices(routes["mini"]) == (Decimal("0.15"), Decimal("0.6"), Decimal("0.075"))
    assert _prices(routes["haiku"]) == (Decimal("1"), Decimal("5"), Decimal("0.1"))
    assert _prices(routes["flash"]) == (Decimal("0.3"), Decimal("2.5"), Decimal("0.03"))
    assert _prices(routes["deepseek"]) == (Decimal("0.28"), Decimal("0.42"), Decimal("0.028"))
    # A provider's prefix in the file's name: groq/openai/gpt-oss-20b for openai/gpt-oss-20b.
    assert _prices(routes["oss"]) == (Decimal("0.075"), Decimal("0.3"), Decimal("0.0375"))
    assert "(from 'groq/openai/gpt-oss-20b')" in out
    # No cache-read price in the entry: cached input stays charged at the input price.
    assert _prices(routes["cerebras"]) == (Decimal("0.1"), Decimal("0.1"), None)
    assert "7 updated" in out


def test_a_priority_route_gets_the_priority_tier_prices(routes) -> None:
    _run(str(FIXTURE))
    # o4-mini priority: 2e-06 in, 8e-06 out, 5e-07 cached (standard: 1.1, 4.4, 0.275)
    assert _prices(routes["mini-priority"]) == (Decimal("2"), Decimal("8"), Decimal("0.5"))


def test_routes_it_cannot_price_keep_their_prices_and_are_reported(routes) -> None:
    before = _prices(routes["groq-mini"]), _prices(routes["local"])
    _, err = _run(str(FIXTURE))
    assert (_prices(routes["groq-mini"]), _prices(routes["local"])) == before
    assert (
        "Groq / gpt-4o-mini: not priced: no entry for 'gpt-4o-mini' with litellm_provider 'groq'"
        in err
    )
    assert "Lab / gpt-4o-mini: not priced: provider 'lab' was not made from a preset" in err


def test_a_provider_named_on_the_command_line_is_priced(routes) -> None:
    _run(str(FIXTURE), "--provider", "lab=openai")
    assert _prices(routes["local"]) == (Decimal("0.15"), Decimal("0.6"), Decimal("0.075"))


def test_a_dry_run_shows_the_changes_and_writes_nothing(routes) -> None:
    out, _ = _run(str(FIXTURE), "--dry-run")
    assert (
        "Openai / gpt-4o-mini (from 'gpt-4o-mini'): "
        "input 1 -> 0.15, output 2 -> 0.6, cached input - -> 0.075 $/Mtok"
    ) in out
    assert "dry run" in out
    assert _prices(routes["mini"]) == (Decimal("1"), Decimal("2"), None)


def test_running_it_twice_changes_nothing_the_second_time(routes) -> None:
    _run(str(FIXTURE))
    out, _ = _run(str(FIXTURE))
    assert "0 updated, 7 unchanged" in out


def test_a_malformed_file_names_the_line_and_changes_nothing(routes, tmp_path: Path) -> None:
    text = FIXTURE.read_text()
    broken = tmp_path / "prices.json"
    # A price that is not a number, in the entry that starts on its line.
    at = text.index('"claude-haiku-4-5": {')
    line = text.count("\n", 0, at) + 1
    broken.write_text(
        text.replace('"input_cost_per_token": 1e-06', '"input_cost_per_token": "1e-06"', 1)
    )
    with pytest.raises(
        CommandError, match=rf"line {line}: 'claude-haiku-4-5': input_cost_per_token"
    ):
        _run(str(broken))
    broken.write_text(text.replace('"mode": "chat",', '"mode": "chat"', 1))
    with pytest.raises(CommandError, match=r"prices.json, line \d+: not valid JSON"):
        _run(str(broken))
    assert _prices(routes["mini"]) == (Decimal("1"), Decimal("2"), None)


def test_cost_charges_cached_input_tokens_at_the_cached_price(routes) -> None:
    _run(str(FIXTURE))
    haiku = routes["haiku"]
    haiku.refresh_from_db()
    region = f.region("eu-west")
    task = f.task("qa", [haiku], [region])
    payload = f.payload(task, haiku, region, T0, cached_tokens=800)
    ingest.ingest([payload])
    # 200 uncached input at $1/M + 800 cached at $0.10/M + 200 output at $5/M
    assert ProbeResult.objects.get().cost_usd == Decimal("0.001280")
    # Not reported (None): all input at the input price.
    assert haiku.cost_usd(1000, 200, None) == Decimal("0.002")


# --- from a URL, through the import's address check --------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    hits: list[str] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()  # no Content-Length: the reader's own bound must hold
        self.wfile.write(type(self).body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"body": FIXTURE.read_bytes(), "hits": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", handler
    httpd.shutdown()
    httpd.server_close()


def test_a_url_is_fetched_when_private_networks_are_allowed(routes, server, settings) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = True
    base, handler = server
    _run(f"{base}/model_prices_and_context_window.json")
    assert handler.hits == ["/model_prices_and_context_window.json"]
    assert _prices(routes["mini"])[0] == Decimal("0.15")


def test_a_url_resolving_to_a_private_address_is_refused_before_connecting(
    routes, server, settings
) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = False
    base, handler = server
    port = base.rsplit(":", 1)[1]
    with pytest.raises(CommandError, match=r"resolves to a non-public address \(127\.0\.0\.1\)"):
        _run(f"https://localhost:{port}/prices.json")
    with pytest.raises(CommandError, match="plain http:// is allowed only for private"):
        _run(f"{base}/prices.json")
    assert handler.hits == []
    assert _prices(routes["mini"])[0] == Decimal("1")


def test_a_source_larger_than_the_bound_is_refused(server, settings) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = True
    base, _ = server
    with pytest.raises(ImportFileError, match="larger than 1000 bytes"):
        fetch(f"{base}/prices.json", limit=1000)
    assert len(fetch(f"{base}/prices.json")) == FIXTURE.stat().st_size


@pytest.mark.parametrize(
    "host",
    [
        "[64:ff9b::7f00:1]",  # NAT64 of 127.0.0.1
        "[2002:7f00:1::1]",  # 6to4 of 127.0.0.1
        "[::7f00:1]",  # IPv4-compatible 127.0.0.1
        "[::ffff:7f00:1]",  # IPv4-mapped 127.0.0.1
        "[64:ff9b::a00:7]",  # NAT64 of 10.0.0.7
    ],
)
def test_ipv6_forms_of_a_private_ipv4_address_are_refused_like_the_engine_refuses_them(
    server, settings, host: str
) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = False
    base, handler = server
    port = base.rsplit(":", 1)[1]
    with pytest.raises(ImportFileError, match=r"resolves to a non-public address"):
        fetch(f"https://{host}:{port}/prices.json")
    assert handler.hits == []


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://example.com:99999/prices.json", "Port out of range"),
        ("https://example.com:https/prices.json", "Port could not be cast"),
        ("https://[::1/prices.json", "Invalid IPv6 URL"),
    ],
)
def test_a_malformed_url_is_refused_saying_why(settings, url: str, why: str) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = False
    with pytest.raises(ImportFileError, match=rf"not a valid URL: {why}"):
        fetch(url)


class _Trickling(http.server.BaseHTTPRequestHandler):
    """Answers a byte every 50 ms, 2 to 5 s in all: from its status line, or in its body."""

    in_headers = False
    body = b"{" + b" " * 38 + b"}"

    def do_GET(self) -> None:
        head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"
        if not type(self).in_headers:
            self.wfile.write(head)
            head = b""
        try:
            for byte in head + self.body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass  # the reader gave up

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("in_headers", [True, False], ids=["headers", "body"])
def test_a_server_trickling_bytes_is_cut_off_at_the_fetchs_deadline(
    settings, in_headers: bool
) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = True
    handler = type("Handler", (_Trickling,), {"in_headers": in_headers})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(ImportFileError, match=r"not fetched within 1 s; refused"):
            fetch(f"http://127.0.0.1:{httpd.server_port}/prices.json", deadline_s=1)
        # Given the time, the same answer is read.
        assert fetch(f"http://127.0.0.1:{httpd.server_port}/prices.json") == _Trickling.body
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_json_nested_deeper_than_python_reads_is_refused_not_raised(routes, tmp_path: Path) -> None:
    deep = tmp_path / "prices.json"
    deep.write_text('{"gpt-4o-mini": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CommandError, match=r"prices.json: not valid JSON: nested too deeply"):
        _run(str(deep))
    long = tmp_path / "long.json"
    long.write_text('{"gpt-4o-mini": {"max_tokens": 1' + "0" * 5000 + "}}")
    with pytest.raises(CommandError, match=r"not valid JSON: an integer of more than 4300 digits"):
        _run(str(long))
    assert _prices(routes["mini"])[0] == Decimal("1")
