"""HTTP/1.1 and HTTP/2, TLS and cleartext, warm and cold, against servers not our own:
hypercorn (HTTP/2 by ALPN and by prior knowledge) and uvicorn (HTTP/1.1 only), both serving
fakellm's app."""

from __future__ import annotations

import pytest

from tests.interop.conftest import ANSWER, Certs, HypercornFakellm
from tests.interop.probing import ok_fields, run_one, spec
from tests.interop.servers import Server
from tests.probes.support import run_all

# The first use installs the servers (LiteLLM: minutes); pytest-timeout counts fixture setup.
pytestmark = [pytest.mark.interop, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@pytest.mark.parametrize(("http2", "version"), [(True, "HTTP/2"), (False, "HTTP/1.1")])
def test_hypercorn_over_tls_negotiates_what_was_asked(
    fakellm_hypercorn: HypercornFakellm, certs: Certs, fmt: str, http2: bool, version: str
) -> None:
    result = run_one(
        spec(fakellm_hypercorn.tls_origin, fmt, "m", http2=http2, verify=certs.ca, cold=True)
    )
    assert not ok_fields(result), ok_fields(result)
    assert result.http_version == version
    assert result.text == ANSWER
    assert result.tls_ms is not None
    assert result.connect_ms is not None


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_hypercorn_cleartext_http2_with_prior_knowledge(
    fakellm_hypercorn: HypercornFakellm, fmt: str
) -> None:
    result = run_one(spec(fakellm_hypercorn.h2c_origin, fmt, "m", http2=True))
    assert not ok_fields(result), ok_fields(result)
    assert result.http_version == "HTTP/2"
    assert result.text == ANSWER
    assert result.tls_ms is None


def test_http2_asked_of_a_tls_server_without_it_falls_back_to_http11(
    fakellm_uvicorn_tls: Server, certs: Certs
) -> None:
    """uvicorn's ALPN offers no h2: the connection is HTTP/1.1 and the result says so."""
    result = run_one(spec(fakellm_uvicorn_tls.origin, "openai", "m", http2=True, verify=certs.ca))
    assert not ok_fields(result), ok_fields(result)
    assert result.http_version == "HTTP/1.1"
    assert result.text == ANSWER


def test_http2_asked_of_a_cleartext_server_without_it_is_not_a_provider_failure(
    fakellm: Server,
) -> None:
    result = run_one(spec(fakellm.origin, "openai", "m", http2=True))
    if result.ok:
        assert result.http_version == "HTTP/1.1"
        assert result.text == ANSWER
    else:
        assert result.error_kind == "config", (result.error_kind, result.error_detail)


def test_a_certificate_we_do_not_trust_is_a_tls_failure(fakellm_uvicorn_tls: Server) -> None:
    result = run_one(spec(fakellm_uvicorn_tls.origin, "openai", "m"))
    assert (result.outcome, result.error_kind) == ("error", "tls")
    assert result.connect_ms is not None


@pytest.mark.parametrize("transport", ["http1", "http2-tls", "http2-cleartext"])
def test_warm_probes_reuse_the_connection_and_cold_ones_do_not(
    fakellm: Server, fakellm_hypercorn: HypercornFakellm, certs: Certs, transport: str
) -> None:
    origin, extra = {
        "http1": (fakellm.origin, {}),
        "http2-tls": (fakellm_hypercorn.tls_origin, {"http2": True, "verify": certs.ca}),
        "http2-cleartext": (fakellm_hypercorn.h2c_origin, {"http2": True}),
    }[transport]
    warm = run_all(*(spec(origin, "openai", "m", **extra) for _ in range(2)))
    cold = run_all(*(spec(origin, "openai", "m", cold=True, **extra) for _ in range(2)))
    for result in warm + cold:
        assert not ok_fields(result), ok_fields(result)
    assert warm[0].connect_ms is not None
    assert warm[1].connect_ms is None
    assert warm[1].dns_ms is None
    assert warm[1].tls_ms is None
    assert all(r.connect_ms is not None for r in cold)
    if transport == "http2-tls":
        assert all(r.tls_ms is not None for r in cold)


def test_the_result_says_whether_the_connection_was_reused(fakellm: Server) -> None:
    warm = run_all(*(spec(fakellm.origin, "openai", "m") for _ in range(2)))
    cold = run_one(spec(fakellm.origin, "openai", "m", cold=True))
    assert getattr(warm[0], "connection_reused", None) is False
    assert getattr(warm[1], "connection_reused", None) is True
    assert getattr(cold, "connection_reused", None) is False
