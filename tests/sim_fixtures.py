"""Session-wide simulated providers for the simulator's and the engine's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simulator.testing import CONFIGS, SimulatorProcess

OPENAI_KEY = "sk-test-fastchip-0123456789"
ANTHROPIC_KEY = "sk-test-claudish-0123456789"


@pytest.fixture(scope="session")
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as process:
        yield process


@pytest.fixture(scope="session")
def tls_sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml", tls=True) as process:
        yield process
