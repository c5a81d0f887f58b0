from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from monitor.pages.whatif import Scenario, Speed, compare, estimate, parse
from monitor.templatetags.rw import ms
from monitor.templatetags.rw_pages import times
from tests.monitor.conftest import World

SEEDS = Scenario(calls=10, input_tokens=10_000, output_tokens=500)


def test_it_reproduces_the_seeds_fast_route() -> None:
    fast = estimate(SEEDS, ttft_ms=1620, tokens_per_s=1823)
    assert fast.per_call_ms == pytest.approx(1894.3, abs=0.1)  # the seeds' 1.89 s/call
    assert fast.total_ms == pytest.approx(18_943, abs=1)
    assert ms(fast.total_ms) == "18.9 s"  # "about nineteen seconds"


def test_it_reproduces_the_seeds_slow_route_and_the_ratio() -> None:
    slow = estimate(SEEDS, ttft_ms=75_100, tokens_per_s=60)
    assert slow.per_call_ms == pytest.approx(83_433, abs=1)  # the seeds' 83.43 s/call
    assert ms(slow.total_ms) == "13 min 54 s"
    lines = compare(
        SEEDS,
        [Speed("GPT-5.5", 75_100, 60), Speed("gpt-oss-120b on Cerebras", 1620, 1823)],
    )
    assert [line.speed.name for line in lines] == ["gpt-oss-120b on Cerebras", "GPT-5.5"]
    assert lines[0].ratio == 1.0
    assert lines[1].ratio == pytest.approx(44.04, abs=0.01)
    assert times(lines[1].ratio) == "44x"


def test_it_runs_p_calls_at_a_time_in_rounds() -> None:
    one_at_a_time = estimate(Scenario(calls=10, output_tokens=100), 500, 100)
    four_at_a_time = estimate(Scenario(calls=10, output_tokens=100, parallel=4), 500, 100)
    assert one_at_a_time.total_ms == pytest.approx(15_000)
    assert four_at_a_time.total_ms == pytest.approx(3 * 1500)  # ceil(10 / 4) rounds


def test_it_prices_every_call_and_leaves_routes_without_figures_last() -> None:
    lines = compare(
        SEEDS,
        [
            Speed("unmeasured", None, None, Decimal("1"), Decimal("1")),
            Speed("priced", 1000, 100, Decimal("2"), Decimal("8")),
        ],
    )
    assert lines[0].speed.name == "priced"
    assert lines[0].cost_usd == Decimal("0.24")  # 10 x (10k x $2 + 500 x $8) / 1M
    assert lines[1].estimate is None
    assert lines[1].ratio is None


def test_it_refuses_nonsense_and_says_why() -> None:
    form = parse({"calls": "0", "output": "lots", "ttft_ms_1": "100"})
    assert form.scenario == Scenario()  # defaults stand in for bad values
    assert any(e.startswith("calls:") for e in form.errors)
    assert any(e.startswith("output:") for e in form.errors)
    assert any("custom route 1" in e for e in form.errors)
    assert form.custom == []


def test_the_task_page_shows_the_totals_of_the_function(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    params = {
        "calls": "10",
        "input": "10000",
        "output": "500",
        "name_1": "Cerebras",
        "ttft_ms_1": "1620",
        "tps_1": "1823",
        "name_2": "GPT-5.5",
        "ttft_ms_2": "75100",
        "tps_2": "60",
    }
    url = reverse("rw-task", args=[probed_world.task.slug])
    response = client.get(url, params, headers={"HX-Request": "true", "HX-Target": "whatif"})
    body = response.content.decode()
    assert "<html" not in body
    assert 'id="whatif"' in body
    rows = dict(re.findall(r'data-whatif="([^"]+)".*?data-total-ms="(\d*)"', body, re.S))
    assert int(rows["Cerebras"]) == round(estimate(SEEDS, 1620, 1823).total_ms)
    assert int(rows["GPT-5.5"]) == round(estimate(SEEDS, 75_100, 60).total_ms)
    assert "18.9 s" in body
    assert "13 min 54 s" in body
    # The measured routes are in the same table, timed from their rollup p50s.
    assert "Fastchip" in body or "FastChip" in body
