"""Fixtures of the end-to-end suite: a ``Cli`` bound to the test's backend and namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import Cli


@pytest.fixture
def cli(backend_url: str, namespace: str, tmp_path: Path) -> Iterator[Cli]:
    """``fleetcron`` on the parametrized backend (see ``CROSS_PROCESS_BACKENDS``)."""
    runner = Cli(backend_url, namespace, tmp_path)
    yield runner
    runner.cleanup()


@pytest.fixture
def sqlite_cli(namespace: str, tmp_path: Path) -> Iterator[Cli]:
    """``fleetcron`` on a SQLite file in the test's directory (no service needed)."""
    runner = Cli(f"sqlite:///{tmp_path / 'fleetcron.db'}", namespace, tmp_path)
    yield runner
    runner.cleanup()
