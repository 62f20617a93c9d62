"""The fast subset of the fault suite, on every backend each scenario applies to.

Each case runs real processes against a real store, injects its faults and hands the
histories and the ledger to the checker; it fails on any anomaly, or when the scenario could
not inject its fault. ``python -m tests.fault --all`` runs the whole suite.
"""

from __future__ import annotations

import os

import pytest

from fault.clock import FaketimeUnavailable, faketime_env
from fault.runner import Scenario, run_scenario
from fault.scenarios import SCENARIOS
from fault.servers import PG_BIN
from services import require_service

pytestmark = pytest.mark.slow

FAST = [
    pytest.param(scenario, backend, id=f"{scenario.name}-{backend}")
    for scenario in SCENARIOS
    for backend in scenario.backends
    if scenario.fast_on(backend)
]


def _require_pair_tools(scenario: Scenario) -> None:
    """A scenario on a PostgreSQL pair of its own needs PostgreSQL's binaries (and
    libfaketime with a C compiler for a standby whose clock is off): skipped without them,
    failed under CI=true, where they are installed."""
    missing = [
        str(PG_BIN / binary)
        for binary in ("postgres", "pg_basebackup", "pg_ctl")
        if not (PG_BIN / binary).exists()
    ]
    if scenario.server_options.get("postgres", {}).get("standby_offset_s"):
        try:
            faketime_env(0)
        except FaketimeUnavailable as exc:
            missing.append(str(exc))
    if missing:
        message = f"{scenario.name} needs {', '.join(missing)}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.parametrize(("scenario", "backend"), FAST)
def test_fast_scenario(scenario: Scenario, backend: str) -> None:
    if backend not in ("sqlite", "etcd") and scenario.needs == "shared":
        require_service(backend)
    if scenario.needs == "pair":
        _require_pair_tools(scenario)
    result = run_scenario(scenario, backend)
    assert result.error is None, result.error
    assert result.report is not None
    assert result.report.ok, result.report.summary()
