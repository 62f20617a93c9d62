"""What a fleet validates before it touches a store: lock terms, namespaces, waits,
limits and scheduler options; and the log records of taking a lock."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from fleetcron._log import log
from fleetcron.durations import DurationLike, to_micros
from fleetcron.errors import ConfigurationError
from fleetcron.jobspec import MAX_COUNT
from fleetcron.keepalive import backoff_s
from fleetcron.lease import AsyncLease, Lease, LeaseTerms
from fleetcron.names import validate_name, validate_namespace
from fleetcron.scheduler import SchedulerOptions
from fleetcron.stores import StoreURL

__all__ = [
    "DEFAULT_LOCK_AT_MOST",
    "NAMESPACE_ENV",
    "cached_terms",
    "lease_terms",
    "log_acquired",
    "log_skipped",
    "older_than_us",
    "resolve_namespace",
    "row_limit",
    "scheduler_options",
    "wait_backoff_s",
    "wait_micros",
]

NAMESPACE_ENV = "FLEETCRON_NAMESPACE"
DEFAULT_LOCK_AT_MOST = "10m"
_MIN_LOCK_AT_MOST_US = 100_000


def resolve_namespace(explicit: str | None) -> str:
    """Namespace: explicit > ``$FLEETCRON_NAMESPACE`` > ``default``."""
    if explicit is not None:
        return validate_namespace(explicit)  # an explicit empty namespace is an error
    return validate_namespace(os.environ.get(NAMESPACE_ENV) or "default")


def lease_terms(
    namespace: str,
    name: str,
    *,
    lock_at_most: DurationLike,
    lock_at_least: DurationLike,
    keepalive: bool,
) -> LeaseTerms:
    """Validate a lock request; every problem is a :class:`ConfigurationError`."""
    most = to_micros(lock_at_most, what="lock_at_most")
    least = to_micros(lock_at_least, what="lock_at_least")
    if most <= 0:
        raise ConfigurationError(f"lock_at_most must be positive, got {lock_at_most!r}")
    if most < _MIN_LOCK_AT_MOST_US:
        raise ConfigurationError(f"lock_at_most must be at least 100ms, got {lock_at_most!r}")
    if least < 0:
        raise ConfigurationError(f"lock_at_least must not be negative, got {lock_at_least!r}")
    if least > most:
        raise ConfigurationError(
            f"lock_at_least ({lock_at_least}) is longer than lock_at_most ({lock_at_most})"
        )
    return LeaseTerms(
        namespace=namespace,
        name=validate_name(name),
        lock_at_most_us=most,
        lock_at_least_us=least,
        keepalive=keepalive,
    )


_lease_terms_cached = functools.lru_cache(maxsize=1024)(lease_terms)


def cached_terms(
    namespace: str,
    name: str,
    *,
    lock_at_most: DurationLike,
    lock_at_least: DurationLike,
    keepalive: bool,
) -> LeaseTerms:
    """:func:`lease_terms`, memoised: a hot loop of ``try_lock`` parses nothing twice."""
    try:
        return _lease_terms_cached(
            namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
        )
    except TypeError:  # an unhashable argument: let validation say what is wrong
        return lease_terms(
            namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
        )


def older_than_us(older_than: DurationLike) -> int:
    micros = to_micros(older_than, what="older_than")
    if micros <= 0:
        raise ConfigurationError(f"older_than must be positive, got {older_than!r}")
    return micros


def row_limit(limit: int) -> int:
    """``limit`` (of ``Fleet.runs``), or a :class:`ConfigurationError`: an integer from 1
    to :data:`~fleetcron.jobspec.MAX_COUNT`, which every store takes (a larger one fails
    in a 64-bit argument, or in a Redis script's double)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigurationError(f"limit must be a positive integer, got {limit!r}")
    if limit > MAX_COUNT:
        raise ConfigurationError(f"limit must be 1 to {MAX_COUNT}, got {limit}")
    return limit


def scheduler_options(
    namespace: str,
    url: StoreURL | None,
    mode: str,
    concurrency: int,
    options: dict[str, Any],
) -> SchedulerOptions:
    """The options of a scheduler of a fleet; every problem is a ConfigurationError."""
    if not isinstance(concurrency, int) or isinstance(concurrency, bool):
        raise ConfigurationError(f"concurrency must be an integer, got {concurrency!r}")
    known = set(SchedulerOptions.__dataclass_fields__) - {"namespace", "mode", "concurrency"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(
            f"scheduler(): unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    options.setdefault("backend_url", url.raw if url is not None else None)
    return SchedulerOptions(namespace=namespace, mode=mode, concurrency=concurrency, **options)


def wait_micros(wait: DurationLike | None) -> int:
    if wait is None:
        return 0
    micros = to_micros(wait, what="wait")
    if micros < 0:
        raise ConfigurationError(f"wait must not be negative, got {wait!r}")
    return micros


def wait_backoff_s(attempt: int) -> float:
    """The pause between tries of ``lock(wait=…)``: 50 ms doubling to 1 s, jittered."""
    return backoff_s(attempt, first_s=0.05, most_s=1.0)


def log_skipped(terms: LeaseTerms) -> None:
    log.info(
        "lock %s is held elsewhere; skipped",
        terms.name,
        extra={"action": "lock_skipped", "lock": terms.name, "namespace": terms.namespace},
    )


def log_acquired(lease: Lease | AsyncLease) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    log.info(
        "acquired %s (fence %d)",
        lease.name,
        lease.fence,
        extra={"action": "lock_acquired", "lock": lease.name, "fence": lease.fence},
    )
