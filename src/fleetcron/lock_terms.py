"""What a lock request is, checked before any store is touched: its terms (lengths,
keepalive and lock mode, validated), how long and how a ``wait`` retries, and the log
records of taking a lock or finding it held."""

from __future__ import annotations

import functools
import logging

from fleetcron._log import log
from fleetcron.durations import DurationLike, to_micros
from fleetcron.errors import ConfigurationError
from fleetcron.keepalive import backoff_s
from fleetcron.lease import AsyncLease, Lease, LeaseTerms, LockMode
from fleetcron.names import validate_name

__all__ = [
    "DEFAULT_LOCK_AT_MOST",
    "LOCK_MODES",
    "cached_terms",
    "lease_terms",
    "log_acquired",
    "log_skipped",
    "wait_backoff_s",
    "wait_micros",
]

DEFAULT_LOCK_AT_MOST = "10m"
_MIN_LOCK_AT_MOST_US = 100_000
LOCK_MODES: tuple[LockMode, ...] = ("lease", "advisory")
"""The lock modes, the default first (:data:`~fleetcron.lease.LockMode`)."""


def lease_terms(
    namespace: str,
    name: str,
    *,
    lock_at_most: DurationLike,
    lock_at_least: DurationLike,
    keepalive: bool,
    mode: str = "lease",
) -> LeaseTerms:
    """Validate a lock request; every problem is a :class:`ConfigurationError`."""
    if mode not in LOCK_MODES:
        raise ConfigurationError(
            f"lock mode must be one of {', '.join(map(repr, LOCK_MODES))}, got {mode!r}"
        )
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
        mode="advisory" if mode == "advisory" else "lease",
    )


_lease_terms_cached = functools.lru_cache(maxsize=1024)(lease_terms)


def cached_terms(
    namespace: str,
    name: str,
    *,
    lock_at_most: DurationLike,
    lock_at_least: DurationLike,
    keepalive: bool,
    mode: str = "lease",
) -> LeaseTerms:
    """:func:`lease_terms`, memoised: a hot loop of ``try_lock`` parses nothing twice."""
    try:
        return _lease_terms_cached(
            namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            mode=mode,
        )
    except TypeError:  # an unhashable argument: let validation say what is wrong
        return lease_terms(
            namespace,
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            mode=mode,
        )


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
