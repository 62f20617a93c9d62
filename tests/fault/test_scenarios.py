"""The fast subset of the fault suite, on every backend each scenario applies to.

Each case runs real processes against a real store, injects its faults and hands the
histories and the ledger to the checker; it fails on any anomaly, or when the scenario could
not inject its fault. ``python -m tests.fault --all`` runs the whole suite.
"""

from __future__ import annotations

import pytest

from fault.runner import Scenario, run_scenario
from fault.scenarios import SCENARIOS
from services import require_service

pytestmark = pytest.mark.slow

FAST = [
    pytest.param(scenario, backend, id=f"{scenario.name}-{backend}")
    for scenario in SCENARIOS
    if scenario.fast
    for backend in scenario.backends
]


@pytest.mark.parametrize(("scenario", "backend"), FAST)
def test_fast_scenario(scenario: Scenario, backend: str) -> None:
    if backend != "sqlite" and scenario.needs == "shared":
        require_service(backend)
    result = run_scenario(scenario, backend)
    assert result.error is None, result.error
    assert result.report is not None
    assert result.report.ok, result.report.summary()
