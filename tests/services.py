"""Where the external services live, and the skip-or-fail rule when one is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetcron.errors import StoreError
from fleetcron.stores import open_store, parse_store_url

SERVICE_URLS = {
    "postgres": os.environ.get(
        "FLEETCRON_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
    ),
    "mysql": os.environ.get("FLEETCRON_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
    "redis": os.environ.get("FLEETCRON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
BACKENDS = ("memory", "sqlite", "postgres", "mysql", "redis")
"""Every backend, the in-memory reference first: the contract suite runs on each."""
STORES = BACKENDS[1:]
"""The backends that hold state outside one process (every one but the in-memory
reference): the ones shared by real processes, and with a clock of their own."""
_reachable: dict[str, str | None] = {}


def require_service(kind: str) -> str:
    """The URL of service ``kind``; skip (fail under CI=true) when it does not answer."""
    url = SERVICE_URLS[kind]
    if kind not in _reachable:
        try:
            open_store(parse_store_url(url)).close()
            _reachable[kind] = None
        except StoreError as exc:
            _reachable[kind] = str(exc)
    problem = _reachable[kind]
    if problem is not None:
        message = f"{kind} service at {url} is not reachable: {problem}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return url


def url_of(kind: str, tmp_path: Path) -> str:
    """The URL of backend ``kind``: SQLite in ``tmp_path``, a service's (skipped, or
    failed under CI=true, when it does not answer), or ``memory://``."""
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'fleetcron.db'}"
    return require_service(kind)
