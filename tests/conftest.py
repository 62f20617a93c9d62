"""Shared fixtures: backend URLs for the contract suite and per-test namespaces.

External services come from ``FLEETCRON_TEST_POSTGRES_URL``, ``FLEETCRON_TEST_MYSQL_URL``
and ``FLEETCRON_TEST_REDIS_URL`` (defaults: the local services). When one cannot be
reached the test is skipped — except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services import BACKENDS, url_of

pytest_plugins = ["pgbouncer_server"]  # the pgbouncer fixture


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own, so tests never see each other's rows."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of each backend in turn (SQLite in the test's temporary directory)."""
    return url_of(request.param, tmp_path)
