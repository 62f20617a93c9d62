"""The backends, found by URL scheme: one table, the only place that names them.

Each backend is a module with two entry points, imported only when a URL of its kind is
opened (so a driver that is not installed costs nothing until asked for):

- ``open_sync(url, *, create, auto_migrate) -> SyncStore``
- ``open_async(url, *, create, migrate) -> AsyncStore`` — optional; a backend without it
  is driven from a worker thread (SQLite: a local file, no network wait).

Everything else a backend brings it keeps to itself: its statement kinds and runner, its
schema and migrations, what ``fleetcron doctor`` should check of its server (the store's
``doctor_facts()``), the async twin of an open store (``async_twin()``), and whether it
keeps a schema (``require_schema()``). A new backend is its package and a row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from fleetcron.errors import ConfigurationError

__all__ = ["BACKENDS", "Backend", "backend", "entry_points", "schemes"]


@dataclass(frozen=True, slots=True)
class Backend:
    """One backend: its ``kind`` (what a parsed URL says), the URL ``schemes`` that name
    it, the ``module`` holding its entry points, and the ``extra`` that installs its
    driver (``pip install 'fleetcron[extra]'``; ``None``: the standard library's)."""

    kind: str
    schemes: tuple[str, ...]
    module: str
    extra: str | None = None


BACKENDS: tuple[Backend, ...] = (
    Backend("memory", ("memory",), "fleetcron.stores.memory"),
    Backend("sqlite", ("sqlite",), "fleetcron.stores.sql.sqlite"),
    Backend("postgres", ("postgresql", "postgres"), "fleetcron.stores.sql.postgres", "postgres"),
    Backend("mysql", ("mysql", "mariadb"), "fleetcron.stores.sql.mysql", "mysql"),
    Backend("redis", ("redis", "rediss", "unix"), "fleetcron.stores.redis.store", "redis"),
    Backend(
        "redis-cluster",
        ("redis+cluster", "rediss+cluster"),
        "fleetcron.stores.redis.cluster",
        "redis",
    ),
    Backend(
        "redis-sentinel",
        ("redis+sentinel", "rediss+sentinel"),
        "fleetcron.stores.redis.sentinel",
        "redis",
    ),
    Backend("etcd", ("etcd", "etcds"), "fleetcron.stores.etcd.store"),
)
_BY_KIND = {entry.kind: entry for entry in BACKENDS}


def schemes() -> dict[str, str]:
    """Every URL scheme, and the kind of backend it names."""
    return {scheme: entry.kind for entry in BACKENDS for scheme in entry.schemes}


def backend(kind: str) -> Backend:
    """The backend of ``kind`` (a parsed URL's)."""
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise ConfigurationError(f"no backend of kind {kind!r}") from None


def entry_points(entry: Backend) -> ModuleType:
    """The module of ``entry``'s entry points, imported now; a driver that is not
    installed is a :class:`ConfigurationError` saying which extra installs it."""
    try:
        return importlib.import_module(entry.module)
    except ImportError as exc:
        raise missing_driver(entry, exc) from None


def missing_driver(entry: Backend, exc: ImportError) -> ConfigurationError:
    """What to say when ``entry``'s driver is not installed."""
    extra = entry.extra or entry.kind
    return ConfigurationError(
        f"the {entry.kind} backend needs its driver: pip install 'fleetcron[{extra}]' ({exc.name})"
    )
