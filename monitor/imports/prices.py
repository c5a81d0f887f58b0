"""Route prices from LiteLLM's `model_prices_and_context_window.json`.

The file maps a model name to its prices per token: `input_cost_per_token`,
`output_cost_per_token`, `cache_read_input_token_cost`, with `_priority` / `_flex` variants
for service tiers, and `litellm_provider` saying whose price it is. A name is the provider's
model id (`gpt-4o-mini`, `claude-sonnet-4-5`) or that id behind the provider's prefix
(`groq/openai/gpt-oss-20b`, `gemini/gemini-2.5-flash`). A route matches the entry for its
model id whose `litellm_provider` is its provider's (monitor.presets.litellm_provider_for):
the same model id at two providers is two prices."""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction

from monitor import presets
from monitor.imports.base import ImportFileError, Report, decode, parse_json
from monitor.models import Route

PER_MTOK = Decimal(1_000_000)
# Route prices are stored to 4 decimal places per million tokens.
QUANTUM = Decimal("0.0001")
MAX_PER_MTOK = Decimal(10) ** 8  # max_digits 12, decimal_places 4
# Route.service_tier -> the suffix of that tier's prices in the file.
TIER_SUFFIX = {"priority": "_priority", "flex": "_flex"}
# The keys read (checked to be prices; the file's many other fields are left alone).
READ_KEYS = {
    base + suffix
    for base in ("input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost")
    for suffix in ("", *TIER_SUFFIX.values())
}
PRICE_FIELDS = ("price_input_per_mtok", "price_output_per_mtok", "price_cached_input_per_mtok")


@dataclass(frozen=True)
class Price:
    """Per million tokens; cached_input None when the file gives no cache-read price."""

    input: Decimal
    output: Decimal
    cached_input: Decimal | None

    def as_fields(self) -> dict[str, Decimal | None]:
        return dict(zip(PRICE_FIELDS, (self.input, self.output, self.cached_input), strict=True))


def _line_of(text: str, key: str) -> int | None:
    at = text.find(json.dumps(key) + ":")
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def parse(data: bytes, source: str) -> dict[str, dict[str, Any]]:
    """The file's entries by model name (numbers as Decimal, as written)."""
    text = decode(data, source)
    document = parse_json(text, source, parse_float=Decimal)
    if not isinstance(document, dict):
        raise ImportFileError(
            "expected a JSON object of model names (LiteLLM's price file format)",
            line=1,
            source=source,
        )
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in document.items():
        if name == "sample_spec":  # the file's own documentation of its fields
            continue
        if not isinstance(entry, dict):
            raise ImportFileError(
                f"{name!r} is not an object", line=_line_of(text, name), source=source
            )
        for key in READ_KEYS & entry.keys():
            if not _is_price(entry[key]):
                raise ImportFileError(
                    f"{name!r}: {key} is {entry[key]!r}, not a price",
                    line=_line_of(text, name),
                    source=source,
                )
        entries[name] = entry
    return entries


def _is_price(value: Any) -> bool:
    """A number a route's price column can hold once per million tokens (under $10^8)."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        return False
    number = Decimal(value)
    return number.is_finite() and 0 <= number * PER_MTOK < MAX_PER_MTOK


def _per_mtok(value: int | Decimal) -> Decimal:
    return (Decimal(value) * PER_MTOK).quantize(QUANTUM)


def find_entry(
    entries: dict[str, dict[str, Any]], litellm_provider: str, model_id: str
) -> tuple[str, dict[str, Any]] | None:
    for name in (f"{litellm_provider}/{model_id}", model_id):
        entry = entries.get(name)
        if entry is not None and entry.get("litellm_provider") == litellm_provider:
            return name, entry
    return None


def price_of(
    entry: dict[str, Any], service_tier: str, notes: list[str], label: str
) -> Price | None:
    """The entry's prices for a route on `service_tier`; None when it has no token prices."""
    if "input_cost_per_token" not in entry or "output_cost_per_token" not in entry:
        return None
    suffix = TIER_SUFFIX.get(service_tier, "")
    if suffix and f"input_cost_per_token{suffix}" not in entry:
        notes.append(f"{label}: the file has no {service_tier} tier price; used the standard one")
        suffix = ""
    cached = entry.get(f"cache_read_input_token_cost{suffix}")
    if cached is None and suffix:
        cached = entry.get("cache_read_input_token_cost")
    return Price(
        input=_per_mtok(entry[f"input_cost_per_token{suffix}"]),
        output=_per_mtok(
            entry.get(f"output_cost_per_token{suffix}", entry["output_cost_per_token"])
        ),
        cached_input=None if cached is None else _per_mtok(cached),
    )


def _money(value: Decimal | None) -> str:
    return "-" if value is None else f"{value.normalize():f}"


def import_prices(
    entries: dict[str, dict[str, Any]],
    *,
    dry_run: bool = False,
    provider_names: dict[str, str] | None = None,
) -> Report:
    """Set every route's prices from the file's entry for it (in one transaction).

    `provider_names` maps a provider slug to its LiteLLM name, for providers not made from a
    preset. A route with no entry keeps its prices and is reported."""
    report = Report(dry_run=dry_run)
    names = provider_names or {}
    with transaction.atomic():
        for route in Route.objects.select_related("provider").order_by(
            "provider__name", "model_id"
        ):
            provider = route.provider
            label = f"{provider.name} / {route.model_id}"
            litellm_provider = names.get(provider.slug) or presets.litellm_provider_for(
                provider.preset, provider.base_url
            )
            if litellm_provider is None:
                report.notes.append(
                    f"{label}: not priced: provider {provider.slug!r} was not made from a "
                    f"preset; name it with --provider {provider.slug}=<litellm_provider>"
                )
                continue
            found = find_entry(entries, litellm_provider, route.model_id)
            if found is None:
                report.notes.append(
                    f"{label}: not priced: no entry for {route.model_id!r} "
                    f"with litellm_provider {litellm_provider!r}"
                )
                continue
            name, entry = found
            price = price_of(entry, route.service_tier, report.notes, label)
            if price is None:
                report.notes.append(f"{label}: not priced: {name!r} has no per-token prices")
                continue
            new = price.as_fields()
            old = {f: getattr(route, f) for f in PRICE_FIELDS}
            if old == new:
                report.unchanged += 1
                continue
            report.updated += 1
            report.changes.append(
                f"{label} (from {name!r}): "
                + ", ".join(
                    f"{f.removeprefix('price_').removesuffix('_per_mtok').replace('_', ' ')} "
                    f"{_money(old[f])} -> {_money(new[f])}"
                    for f in PRICE_FIELDS
                    if old[f] != new[f]
                )
                + " $/Mtok"
            )
            Route.objects.filter(pk=route.pk).update(**new)
        if dry_run:
            transaction.set_rollback(True)
    return report
