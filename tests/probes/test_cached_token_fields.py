"""Cached input tokens as each provider reports them: what cached-input prices are charged on."""

from __future__ import annotations

from probes.formats import WIRE_FORMATS


def test_openai_reports_cached_tokens_in_prompt_tokens_details() -> None:
    usage = WIRE_FORMATS["openai"].usage(
        {
            "prompt_tokens": 1200,
            "completion_tokens": 50,
            "prompt_tokens_details": {"cached_tokens": 1024},
        }
    )
    assert (usage.input_tokens, usage.cached_tokens) == (1200, 1024)


def test_deepseek_reports_cache_hits_in_a_field_of_its_own() -> None:
    usage = WIRE_FORMATS["openai"].usage(
        {
            "prompt_tokens": 1200,
            "completion_tokens": 50,
            "prompt_cache_hit_tokens": 1152,
            "prompt_cache_miss_tokens": 48,
        }
    )
    assert (usage.input_tokens, usage.cached_tokens) == (1200, 1152)


def test_no_cache_field_is_not_a_reported_zero() -> None:
    usage = WIRE_FORMATS["openai"].usage({"prompt_tokens": 1200, "completion_tokens": 50})
    assert usage.cached_tokens is None
