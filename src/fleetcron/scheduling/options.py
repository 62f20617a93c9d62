"""How one replica runs: the options of :class:`~fleetcron.scheduler.AsyncScheduler`,
checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetcron.errors import ConfigurationError
from fleetcron.pings import check_ping_url
from fleetcron.scheduling.heartbeat import DEFAULT_HEARTBEAT_S
from fleetcron.scheduling.monitor import DEFAULT_MONITOR_S
from fleetcron.scheduling.retention import DEFAULT_RETENTION_S
from fleetcron.stores.url import StoreURL

__all__ = ["SchedulerOptions", "scheduler_options"]


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """How one replica runs. ``concurrency`` caps the runs in flight on this replica;
    ``heartbeat_s`` is how often it records its heartbeat (docs/design/replicas.md);
    ``monitor_s`` how often the replica that watches the namespace's jobs reads their
    health (:mod:`fleetcron.scheduling.monitor`; 0 turns watching off on this replica);
    ``retention_s`` how often, while it watches, it deletes its jobs' runs past their
    retention (:mod:`fleetcron.scheduling.retention`; 0: never from this replica)."""

    namespace: str
    mode: str = "claim"
    concurrency: int = 16
    tick_s: float = 1.0
    shutdown_grace_s: float = 30.0
    kill_grace_s: float = 5.0
    leader_ttl_us: int = 15_000_000
    echo: bool = True
    backend_url: str | None = None
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    monitor_s: float = DEFAULT_MONITOR_S
    retention_s: float = DEFAULT_RETENTION_S
    alert_webhook: str | None = None

    def __post_init__(self) -> None:
        """Every problem is a :class:`ConfigurationError` naming the option."""
        if self.mode not in ("claim", "leader"):
            raise ConfigurationError(f"mode must be claim or leader, not {self.mode!r}")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise ConfigurationError(f"concurrency must be an integer, got {self.concurrency!r}")
        if self.concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        # (name, value, whether 0 is allowed): 0 turns the monitor or retention off.
        for name, zero_ok in (
            ("tick_s", False),
            ("shutdown_grace_s", True),
            ("kill_grace_s", True),
            ("heartbeat_s", False),
            ("monitor_s", True),
            ("retention_s", True),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{name} must be a number of seconds, not {value!r}")
            if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
                wanted = "must not be negative" if zero_ok else "must be positive"
                raise ConfigurationError(f"{name} {wanted}, not {value!r}")
        if self.alert_webhook is not None:
            check_ping_url(self.alert_webhook)


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
