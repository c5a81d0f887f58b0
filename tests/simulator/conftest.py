from __future__ import annotations

from collections.abc import Iterator

import pytest

from simulator.testing import CONFIGS, SimulatorProcess
from tests.sim_fixtures import sim, tls_sim  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def http1_only_sim() -> Iterator[SimulatorProcess]:
    """TLS, but the server offers HTTP/1.1 only."""
    with SimulatorProcess(CONFIGS / "test.toml", tls=True, http2=False) as process:
        yield process
