"""Alert webhooks: a JSON POST for each change of a job's health the monitor says.

The replica watching the namespace (:mod:`fleetcron.scheduling.monitor`) turns each
:class:`Alert` — a job became overdue (again for each later
slot that also passed its grace), stuck or failing, or is healthy again — into one POST to
the job's ``alert_webhook``, else the jobs file's global one. They go out like pings
(:mod:`fleetcron.pings`): in the background, never blocking the scheduler, in order per
job, each try bounded, retried with back-off, the URL's secret path never logged.

Each alert is said by one replica only: the store records it (the job's alert marker)
before it is posted, so a change of the watching replica neither repeats it nor loses a
recovery; a store outage delays an alert, never doubles it. Delivery of each POST is
at least once: when an answer is lost the try is repeated, so a receiver may see the
same POST twice; ``idempotency_key`` (the same in every try of one alert, another in
every other alert) lets it drop the second.

The body (``application/json``)::

    {"event": "overdue", "job": "invoices", "namespace": "prod", "state": "overdue",
     "summary": "invoices: overdue: no success since the slot of 2026-12-01T07:35:00Z …",
     "reasons": ["no success since the slot of …"], "slot": "2026-12-01T07:35:00Z",
     "expected_slot": "…", "last_success": "…", "last_run": {"slot": "…", "state": "…"},
     "at": "2026-12-01T07:41:02Z", "replica": "host:pid:…",
     "idempotency_key": "5f0c…"}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetcron.health import JobHealth
from fleetcron.jobspec import JobSpec
from fleetcron.pings import AsyncPinger, Ping
from fleetcron.status import iso

__all__ = ["Alert", "AlertSender", "payload"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """One change of a job's health, said once across the fleet.

    ``idempotency_key`` identifies this alert (a digest of the namespace, the marker and
    the marker's fence): the same for every try of its webhook POST, another for every
    other alert, so a receiver can drop a POST it already had."""

    job: str
    event: str  # "overdue", "stuck", "failing" or "recovered"
    health: JobHealth
    slot_us: int | None  # the overdue slot, for "overdue"
    idempotency_key: str = ""


def payload(alert: Alert, namespace: str, replica: str) -> dict[str, object]:
    """The JSON document of ``alert``."""
    health = alert.health
    last = health.last_run
    return {
        "event": alert.event,
        "job": alert.job,
        "namespace": namespace,
        "state": health.state,
        "summary": f"{alert.job}: {alert.event}"
        + (f": {'; '.join(health.reasons)}" if health.reasons else ""),
        "reasons": list(health.reasons),
        "slot": iso(alert.slot_us),
        "expected_slot": iso(health.expected_slot_us),
        "last_success": iso(health.last_success_us),
        "last_run": None
        if last is None
        else {"slot": iso(last.slot_us), "state": last.state, "error": last.error},
        "at": iso(health.now_us),
        "replica": replica,
        "idempotency_key": alert.idempotency_key,
    }


class AlertSender:
    """Posts each alert to its webhook through ``pinger``: the job's ``alert_webhook`` in
    ``specs`` (read at send time, so a reload's change holds at once), else ``default``,
    the jobs file's global one (``None``: none)."""

    def __init__(
        self,
        pinger: AsyncPinger,
        namespace: str,
        replica: Callable[[], str],
        specs: Mapping[str, JobSpec],
        default: str | None,
    ) -> None:
        self._pinger = pinger
        self._namespace = namespace
        self._replica = replica
        self._specs = specs
        self.default = default

    def __call__(self, alert: Alert) -> None:
        spec = self._specs.get(alert.job)
        own = spec.alert_webhook if spec is not None else None
        url = own if own is not None else self.default
        if url is None:
            return
        body = json.dumps(payload(alert, self._namespace, self._replica())).encode()
        self._pinger.send(
            Ping(
                job=alert.job,
                run_id=f"alert:{alert.job}",  # one queue per job: its alerts stay in order
                kind=f"alert {alert.event}",
                url=url,
                body=body,
                content_type="application/json",
            )
        )
