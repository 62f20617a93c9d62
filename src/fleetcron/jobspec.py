"""A job's definition: :class:`JobSpec`, its targets, its policies' choices and the
defaults of its options. How options given by a user become a :class:`JobSpec` — checked,
every mistake named — is :mod:`fleetcron.job_options`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

from fleetcron.errors import ConfigurationError
from fleetcron.schedules import (
    Schedule,
)

__all__ = [
    "CATCHUP_POLICIES",
    "DEFAULTS",
    "DEFAULT_RETENTION",
    "ISOLATE_CHOICES",
    "JOB_KEYS",
    "MIN_EVERY_US",
    "OVERLAP_POLICIES",
    "CallTarget",
    "Catchup",
    "CommandTarget",
    "Isolate",
    "JobSpec",
    "Overlap",
    "Retention",
    "Target",
    "one_line",
    "unique_jobs",
]

Overlap = Literal["skip", "buffer_one", "allow", "cancel_other"]
Isolate = Literal["none", "process"]
Catchup = Literal["skip", "latest", "all"]

OVERLAP_POLICIES: tuple[Overlap, ...] = get_args(Overlap)
ISOLATE_CHOICES: tuple[Isolate, ...] = get_args(Isolate)
CATCHUP_POLICIES: tuple[Catchup, ...] = get_args(Catchup)

DEFAULTS: Mapping[str, str | int | bool | None] = MappingProxyType(
    {
        "timezone": "UTC",
        "lock_at_most": "10m",
        "lock_at_least": "0s",
        "timeout": None,
        "overlap": "skip",
        "catchup": "latest",
        "catchup_window": "1h",
        "max_catchup": 100,
        "retries": 0,
        "retry_backoff": "30s",
        "jitter": "0s",
        "grace": None,
        "stuck_after": None,  # not set: from the job's recent durations (fleetcron.health)
        "ping_url": None,
        "keepalive": True,
        "isolate": "none",
        "retention": None,  # not set: the [fleetcron] table's, else DEFAULT_RETENTION's
        "retention_keep": None,
        "alert_webhook": None,
    }
)

MAX_COUNT = 2**31 - 1  # every count is stored in a 32-bit integer column or argument
MIN_EVERY_US = 100_000  # every slot is a ledger row and a claim: not a busy loop
JOB_KEYS: frozenset[str] = frozenset({"schedule", "every", "at", "command", "call", *DEFAULTS})


@dataclass(frozen=True, slots=True)
class CommandTarget:
    """A command run as an argv list, never through a shell."""

    argv: tuple[str, ...]

    def definition(self) -> dict[str, object]:
        """``{"kind": "command", "argv": [...]}``."""
        return {"kind": "command", "argv": list(self.argv)}


@dataclass(frozen=True, slots=True)
class CallTarget:
    """A Python callable, known by its ``module:function`` reference."""

    reference: str
    function: Callable[..., object]

    def definition(self) -> dict[str, object]:
        """``{"kind": "call", "reference": "module:function"}``."""
        return {"kind": "call", "reference": self.reference}


Target = CommandTarget | CallTarget


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a job's finished runs stay in the run ledger.

    A row is deleted once it finished more than ``older_than_us`` ago *and* is not one of
    the job's newest ``keep`` finished rows: young rows stay whatever their number, and
    the newest ``keep`` stay whatever their age. A row still queued, running, or failed
    with a retry pending is never deleted, and does not count among the ``keep``.
    """

    older_than_us: int = 30 * 86_400_000_000
    keep: int = 100


DEFAULT_RETENTION = Retention()
"""30 days, and at least the newest 100 runs of each job."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """One validated job definition. Durations are integer microseconds."""

    name: str
    schedule: Schedule
    timezone: str
    target: Target
    lock_at_most_us: int
    lock_at_least_us: int
    timeout_us: int | None
    overlap: Overlap
    catchup: Catchup
    catchup_window_us: int
    max_catchup: int
    retries: int
    retry_backoff_us: int
    jitter_us: int
    grace_us: int | None
    ping_url: str | None
    keepalive: bool
    isolate: Isolate = "none"
    retention_us: int | None = None
    retention_keep: int | None = None
    alert_webhook: str | None = None
    stuck_after_us: int | None = None
    """A run holding its slot longer than this is *stuck* (``None``: judged from the job's
    recent durations, :mod:`fleetcron.health`)."""

    @property
    def retention(self) -> Retention:
        """The job's retention rule: its ``retention`` and ``retention_keep`` (given for
        the job, or for every job of its file), each else :data:`DEFAULT_RETENTION`'s."""
        return self.retention_with(DEFAULT_RETENTION)

    def retention_with(self, default: Retention) -> Retention:
        """The job's retention rule, each part not given taken from ``default`` (a
        store's own default: :func:`fleetcron.scheduling.retention.store_retention`)."""
        return Retention(
            older_than_us=default.older_than_us if self.retention_us is None else self.retention_us,
            keep=default.keep if self.retention_keep is None else self.retention_keep,
        )

    def definition(self) -> dict[str, object]:
        """The definition as plain JSON-able data (the name excluded): what replicas compare."""
        return {
            "schedule": dict(self.schedule.definition()),
            "timezone": self.timezone,
            "target": self.target.definition(),
            "lock_at_most_us": self.lock_at_most_us,
            "lock_at_least_us": self.lock_at_least_us,
            "timeout_us": self.timeout_us,
            "overlap": self.overlap,
            "catchup": self.catchup,
            "catchup_window_us": self.catchup_window_us,
            "max_catchup": self.max_catchup,
            "retries": self.retries,
            "retry_backoff_us": self.retry_backoff_us,
            "jitter_us": self.jitter_us,
            "grace_us": self.grace_us,
            # The URL holds the check's secret: the store keeps only a digest of it, enough
            # for replicas to tell two definitions apart.
            "ping_url": _digest(self.ping_url) if self.ping_url is not None else None,
            "keepalive": self.keepalive,
            # Only when set: a job defined before the key existed keeps its fingerprint.
            **({"isolate": self.isolate} if self.isolate != "none" else {}),
            **({"retention_us": self.retention_us} if self.retention_us is not None else {}),
            **({"retention_keep": self.retention_keep} if self.retention_keep is not None else {}),
            **({"stuck_after_us": self.stuck_after_us} if self.stuck_after_us is not None else {}),
            **(
                {"alert_webhook": _digest(self.alert_webhook)}
                if self.alert_webhook is not None
                else {}
            ),
        }

    def fingerprint(self) -> str:
        """A stable hash of :meth:`definition` (32 hex digits), equal across processes.

        A ``call`` target contributes its ``module:function`` reference, not the object.
        """
        canonical = json.dumps({"v": 1, **self.definition()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _digest(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:32]


def unique_jobs(specs: Iterable[JobSpec], *, where: str) -> tuple[JobSpec, ...]:
    """``specs`` as a tuple, or a :class:`ConfigurationError` if a name occurs twice."""
    seen: set[str] = set()
    result: list[JobSpec] = []
    for spec in specs:
        if spec.name in seen:
            raise ConfigurationError(f"{where}: job {spec.name!r} is defined twice")
        seen.add(spec.name)
        result.append(spec)
    return tuple(result)


def one_line(message: str) -> str:
    return " ".join(message.split())
