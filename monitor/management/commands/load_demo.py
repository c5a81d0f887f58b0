from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from monitor import demo_history, presets, scenario_presets
from monitor.models import (
    BODY_JSON,
    BODY_MSGPACK_GZIP,
    CLASS_ASYNC,
    CLASS_BATCH,
    CLASS_INTERACTIVE,
    CONN_COLD,
    CONN_WARM,
    GRADER_JSON_SCHEMA,
    GRADER_REGEX,
    HTTP_1_1,
    HTTP_2,
    METRIC_E2E_P50,
    PREFIX_FRESH,
    PREFIX_STABLE,
    WIRE_AZURE,
    WIRE_BEDROCK,
    WIRE_GEMINI,
    WIRE_OPENAI,
    WIRE_RESPONSES,
    EvalCase,
    Provider,
    Region,
    Route,
    Task,
)
from simulator import tasks as sim_tasks
from simulator.config import Config, load
from simulator.config import Provider as SimProvider

# The api-version the simulated Azure deployments accept (a GA version of the real service).
AZURE_API_VERSION = "2024-10-21"
DEMO_CONFIG = Path(__file__).resolve().parents[3] / "simulator" / "configs" / "demo.toml"
REGIONS = [("US East", "us-east"), ("EU West", "eu-west"), ("AP South", "ap-south")]


def _endpoints(sim: SimProvider, base: str) -> list[tuple[list[str], str, str]]:
    """(model ids, base URL, wire format) per product provider. An Azure OpenAI provider is a
    deployment URL, so each simulated Azure model (a deployment) is a provider of its own."""
    if sim.profile == "azure-openai":
        return [([m], f"{base}/{sim.slug}/openai/deployments/{m}", WIRE_AZURE) for m in sim.models]
    suffix = {WIRE_OPENAI: "/v1", WIRE_RESPONSES: "/v1", WIRE_GEMINI: "/v1beta"}
    return [(list(sim.models), f"{base}/{sim.slug}{suffix.get(sim.format, '')}", sim.format)]


def _request_settings(profile: str, wire: str) -> dict[str, Any]:
    """What each simulated API needs, as its real counterpart does (simulator/README.md)."""
    settings = dict(presets.ROUTE_PRESETS["chat"]["settings"])
    if profile == "openai-reasoning":
        settings.update(presets.ROUTE_PRESETS["openai-reasoning"]["settings"])
        settings["reasoning_effort"] = ""  # the API's default (medium): the seeds' figures
    if profile == "openai-responses":
        settings.update(presets.ROUTE_PRESETS["responses-reasoning"]["settings"])
    if profile in ("gemini", "bedrock"):  # thinks when asked, shows summaries of it
        settings["thinking_budget_tokens"] = 1024
    if wire == WIRE_AZURE:
        settings["api_version"] = AZURE_API_VERSION
    return settings


class Command(BaseCommand):
    help = "Load (or refresh) the demo configuration: simulated providers, routes, regions, tasks."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--simulator", default="http://127.0.0.1:8100", help="simulator base URL"
        )
        parser.add_argument("--config", default=str(DEMO_CONFIG))
        parser.add_argument(
            "--history",
            action="store_true",
            help="on a database without measured results, add a week of generated demo "
            "history (monitor.demo_history), marked as such",
        )
        parser.add_argument(
            "--region-rtt",
            action="append",
            default=[],
            metavar="SLUG=MS",
            help="a demo region's round trip to the simulator, for the history (repeatable)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = load(options["config"])
        self._configure(config, options["simulator"].rstrip("/"))
        if options["history"]:
            rtt = {}
            for item in options["region_rtt"]:
                slug, _, ms = item.partition("=")
                try:
                    rtt[slug] = float(ms)
                except ValueError:
                    raise CommandError(f"--region-rtt: expected SLUG=MS, got {item!r}") from None
            started = time.monotonic()
            written = demo_history.generate(config, rtt_ms=rtt)
            if written:
                self.stdout.write(
                    f"Demo history: {written} generated results over the last "
                    f"{demo_history.DAYS} days, marked as generated "
                    f"({time.monotonic() - started:.1f} s)."
                )
            else:
                self.stdout.write(
                    "Demo history not added: the database already holds results "
                    "(measured ones, or the history itself)."
                )

    @transaction.atomic
    def _configure(self, config: Config, base: str) -> None:
        regions = [
            Region.objects.update_or_create(slug=slug, defaults={"name": name})[0]
            for name, slug in REGIONS
        ]
        routes = _simulated_routes(config, base)
        tasks = _demo_tasks()
        for task in tasks:
            task.routes.set(routes)
            task.regions.set(regions)
        _eval_cases(*tasks)
        self.stdout.write(
            f"Demo configuration: {len(config.providers)} simulated providers, {len(routes)} routes, "
            f"{len(regions)} regions, 3 tasks (one a 10-call scenario)."
        )


def _simulated_routes(config: Config, base: str) -> list[Route]:
    """A provider per simulated provider (per deployment for Azure's), a route per model."""
    routes = []
    for sim in config.providers.values():
        for model_ids, url, wire in _endpoints(sim, base):
            whole = len(model_ids) == len(sim.models)  # else one Azure deployment of several
            name = sim.name or sim.slug
            provider, _ = Provider.objects.update_or_create(
                slug=sim.slug if whole else f"{sim.slug}-{model_ids[0]}",
                defaults={
                    "name": name if whole else f"{name}: {model_ids[0]}",
                    "base_url": url,
                    "wire_format": wire,
                    # The simulator serves HTTP/2 (h2c) to every provider; msgpack bodies
                    # only to those configured to take them.
                    "http2": True,
                    "accepts_msgpack": sim.accepts_msgpack,
                    "is_simulated": True,
                    "aws_region": sim.region if wire == WIRE_BEDROCK else "",
                },
            )
            if wire == WIRE_BEDROCK and sim.aws_keys and not provider.has_api_key:
                # Signed with SigV4, as most AWS teams reach Bedrock.
                provider.set_aws_credentials(*next(iter(sim.aws_keys.items())))
                provider.save(update_fields=["api_key_encrypted"])
            elif sim.api_keys and not provider.has_api_key:
                provider.set_api_key(sim.api_keys[0])
                provider.save(update_fields=["api_key_encrypted"])
            for model_id in model_ids:
                model = sim.models[model_id]
                route, _ = Route.objects.update_or_create(
                    provider=provider,
                    model_id=model.id,
                    defaults={
                        "display_name": f"{provider.name.replace(' (simulated)', '')} / {model.id}",
                        "price_input_per_mtok": Decimal(str(model.price_input_per_mtok)),
                        "price_output_per_mtok": Decimal(str(model.price_output_per_mtok)),
                        "quality_index": model.quality_index,
                        **_request_settings(model.profile, wire),
                    },
                )
                routes.append(route)
    return routes


def _demo_tasks() -> tuple[Task, Task, Task]:
    """The three demo tasks: an interactive answer, a batch summary and a 10-call scenario."""
    support, _ = Task.objects.update_or_create(
        slug="support-answer",
        defaults={
            "name": "Support answer",
            "description": "An interactive reply: short prompt, fast first token matters.",
            "system_prompt": "You are a helpful support assistant.",
            "user_template": "{input}\n" + sim_tasks.INSTRUCTION,
            "input_tokens": 1500,
            "max_tokens": 300,
            "latency_class": CLASS_INTERACTIVE,
            "ttft_p95_budget_ms": 2000,
            "e2e_p95_budget_ms": 8000,
            "latency_metric": METRIC_E2E_P50,
            "min_pass_rate": 0.8,
            "probe_interval_s": 60,
            "probe_timeout_s": 120,
            "race_interval_s": 300,
            "http_versions": [HTTP_1_1, HTTP_2],
            "connection_modes": [CONN_WARM, CONN_COLD],
            "body_encodings": [BODY_JSON],
            "prefix_modes": [PREFIX_STABLE],
        },
    )
    summary, _ = Task.objects.update_or_create(
        slug="document-summary",
        defaults={
            "name": "Document summary",
            "description": "A batch job over a 10k-token document (the seeds' agent step).",
            "system_prompt": "You summarise documents.",
            "user_template": "{input}\n" + sim_tasks.INSTRUCTION,
            "input_tokens": 10_000,
            "max_tokens": 500,
            "latency_class": CLASS_BATCH,
            "ttft_p95_budget_ms": 30_000,
            "e2e_p95_budget_ms": 60_000,
            "latency_metric": METRIC_E2E_P50,
            "min_quality_index": 40,
            "probe_interval_s": 120,
            "probe_timeout_s": 180,
            "http_versions": [HTTP_1_1],
            "connection_modes": [CONN_WARM],
            "body_encodings": [BODY_JSON, BODY_MSGPACK_GZIP],
            "prefix_modes": [PREFIX_STABLE, PREFIX_FRESH],
        },
    )
    agent, _ = Task.objects.update_or_create(
        slug="agent-loop-10",
        defaults={
            "name": "Agent loop: 10 calls",
            "description": "A scenario (the seeds' agent example): ten sequential calls "
            "over a growing conversation on one route, then the final answer validated. "
            "Ranked by application end-to-end time, shown beside the calculator's estimate.",
            "system_prompt": "You are an agent that works in small steps.",
            "user_template": "{input}",
            "input_tokens": 2000,
            "max_tokens": 60,
            "latency_class": CLASS_ASYNC,
            "latency_metric": "",
            "probe_interval_s": 300,
            # Ten calls on the reasoning route take about 9 minutes (the seeds' agent task
            # took 13 min 54 s): the longest deadline a task may set, so every route's runs
            # can end in an answer.
            "probe_timeout_s": 900,
            "http_versions": [HTTP_1_1],
            "connection_modes": [CONN_WARM],
            "body_encodings": [BODY_JSON],
            "prefix_modes": [PREFIX_STABLE],
        },
    )
    steps = scenario_presets.apply(agent, "agent-loop")
    # The agent's actions are short; the final answer has room for its ANSWER line.
    steps[-1].max_tokens = 400
    steps[-1].save(update_fields=["max_tokens"])
    return support, summary, agent


def _eval_cases(support: Task, summary: Task, agent: Task) -> None:
    """Ten questions with a known answer, graded by regex (numbers) or JSON schema."""
    for q in sim_tasks.questions(10):
        if q.kind == "arithmetic":
            grader, expected, schema = GRADER_REGEX, rf"ANSWER:\s*{q.answer}\b", None
        else:
            data = json.loads(q.answer)
            grader, expected = GRADER_JSON_SCHEMA, ""
            schema = {
                "type": "object",
                "properties": {"name": {"const": data["name"]}, "age": {"const": data["age"]}},
                "required": ["name", "age"],
            }
        for task in (support, summary, agent):
            if task is agent and q.kind != "arithmetic":
                continue  # the agent's last step asks the question; numbers grade simply
            EvalCase.objects.update_or_create(
                task=task,
                name=q.name,
                defaults={
                    "input": q.prompt,
                    "grader": grader,
                    "expected": expected,
                    "json_schema": schema,
                },
            )
