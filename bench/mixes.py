"""The load benchmarks' worlds: which simulated routes the tasks probe, and how long a probe
lasts (bench_load, bench_region).

- realistic (the default): a third of the routes are reasoning models that think in silence
  for 20 to 75 s before their first token and then stream several hundred tokens at 30 to 60
  tok/s (e2e ~28 to ~90 s); the rest are fast chat routes (sub-second TTFT, 150-250 tok/s).
  One task in twenty is a 10-call agent scenario, on the fast routes and the shortest
  reasoning one (about 20 s on a fast route, about 5 minutes on a reasoning one).
  simulator/configs/bench-realistic.toml.
- fast: the old mix, every probe well under a second (simulator/configs/test.toml's fastchip).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "simulator" / "configs"
THINKING = ("think-20", "think-40", "think-60", "think-75")


@dataclass(frozen=True)
class Mix:
    name: str
    config: Path  # the simulator's configuration
    provider: str  # the simulator provider every route goes to
    api_key: str
    # The models of each bench provider's routes: provider p takes models[p % len(models)].
    models: tuple[tuple[str, ...], ...]
    reasoning: frozenset[str]  # models asked with max_completion_tokens and medium effort
    input_tokens: int
    max_tokens: int  # also the reasoning routes' max_completion_tokens (reasoning + answer)
    probe_timeout_s: int
    warmup_s: int  # to a steady number of probes in flight (the longest runs have overlapped)
    # The scenario task (the last task; none when empty): its routes' models and deadline.
    scenario_models: frozenset[str] = frozenset()
    scenario_timeout_s: int = 0


MIXES = {
    "realistic": Mix(
        name="realistic",
        config=CONFIGS / "bench-realistic.toml",
        provider="realistic",
        api_key="sk-bench-realistic-0123456789",
        # One reasoning route in three, their TTFTs spread over 20-75 s.
        models=tuple(("fast-chat", "fast-mini", think) for think in THINKING),
        reasoning=frozenset(THINKING),
        input_tokens=200,
        max_tokens=4000,
        probe_timeout_s=180,
        warmup_s=300,
        scenario_models=frozenset({"fast-chat", "fast-mini", "think-20"}),
        scenario_timeout_s=600,
    ),
    "fast": Mix(
        name="fast",
        config=CONFIGS / "test.toml",
        provider="fastchip",
        api_key="sk-test-fastchip-0123456789",
        models=(("fast-small", "mid-think", "slow-large"),),
        reasoning=frozenset(),
        input_tokens=50,
        max_tokens=60,
        probe_timeout_s=20,
        warmup_s=60,
    ),
}

# The scenario: an agent loop of 10 calls, each carrying the conversation so far.
SCENARIO_STEPS = 10


@dataclass(frozen=True)
class World:
    regions: list[str]  # region slugs
    combinations: int  # (task, route, region) probed
    scenario_combinations: int  # of them, scenario slots (10 calls each)
    longest_timeout_s: int  # the longest task deadline (closing a window waits for it)


def route_settings(mix: Mix, model: str) -> dict[str, Any]:
    from monitor import presets

    if model in mix.reasoning:
        reasoning = presets.ROUTE_PRESETS["openai-reasoning"]["settings"]
        return {**reasoning, "reasoning_effort": "medium"}
    return dict(presets.ROUTE_PRESETS["chat"]["settings"])


def build_world(
    mix: Mix,
    sim_url: str,
    tasks: int,
    routes: int,
    regions: int,
    interval_s: int,
    region_prefix: str = "r",
) -> World:
    """Regions, simulated routes (three a provider) and tasks probing every route from every
    region (the scenario task: only its mix's scenario routes)."""
    from monitor.models import Provider, Region, Route, ScenarioStep, Task

    slugs = [f"{region_prefix}{i}" for i in range(regions)]
    region_rows = [Region.objects.create(name=s.upper(), slug=s) for s in slugs]
    route_rows: list[Route] = []
    p = 0
    while len(route_rows) < routes:
        provider = Provider.objects.create(
            name=f"Sim {p}",
            slug=f"sim{p}",
            base_url=f"{sim_url}/{mix.provider}/v1",
            is_simulated=True,
        )
        provider.set_api_key(mix.api_key)
        provider.save(update_fields=["api_key_encrypted"])
        for model in mix.models[p % len(mix.models)]:
            if len(route_rows) < routes:
                route_rows.append(
                    Route.objects.create(
                        provider=provider,
                        model_id=model,
                        display_name=f"sim{p} / {model}",
                        **route_settings(mix, model),
                    )
                )
        p += 1
    scenario_routes = [r for r in route_rows if r.model_id in mix.scenario_models]
    combinations = scenario_combinations = 0
    for t in range(tasks):
        scenario = bool(scenario_routes) and t == tasks - 1
        task = Task.objects.create(
            name=f"Agent loop {t}" if scenario else f"Load {t}",
            slug=f"load-{t}",
            user_template="Say hello in a few words.",
            input_tokens=mix.input_tokens,
            max_tokens=mix.max_tokens,
            min_pass_rate=0.0,
            ttft_p95_budget_ms=2000,
            e2e_p95_budget_ms=8000,
            probe_interval_s=interval_s,
            probe_timeout_s=mix.scenario_timeout_s if scenario else mix.probe_timeout_s,
            http_versions=["1.1"],
            connection_modes=["warm"],
            body_encodings=["json"],
            prefix_modes=["stable"],
        )
        chosen = scenario_routes if scenario else route_rows
        task.routes.set(chosen)
        task.regions.set(region_rows)
        combinations += len(chosen) * len(region_rows)
        if scenario:
            scenario_combinations = len(chosen) * len(region_rows)
            ScenarioStep.objects.bulk_create(
                ScenarioStep(
                    task=task,
                    order=i,
                    prompt_template=(
                        "Step {step}: read the tool's result and decide the next action."
                        if i < SCENARIO_STEPS - 1
                        else "Step {step}: give the user the final answer."
                    ),
                    input_tokens=500,
                    max_tokens=mix.max_tokens,
                )
                for i in range(SCENARIO_STEPS)
            )
    longest = max(mix.probe_timeout_s, mix.scenario_timeout_s if scenario_routes else 0)
    return World(slugs, combinations, scenario_combinations, longest)
