"""Definitions: which definition of a job governs when replicas disagree.

Each replica registers its definition of every job when it starts, so the store holds the
definition of the replica that started last — in a rolling deploy, the new version's.
That one governs. The store refuses a claim made for another definition (``conflict``,
nothing written), so a replica whose definition was superseded runs none of the job's
slots, scheduled or triggered, and the fleet never runs the union of two schedules.

The replica learns it from its claims' answers (and, standing by in leader mode, from the
job rows it reads each pass): no extra round trip. It keeps claiming the job's slots as its
own schedule has them, and runs the job again once an answer shows the definitions agree
(the stored one was changed back, or this replica restarted with the new definition).
Both replicas log the conflict once (the superseded one also once when it ends), never
once per pass.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetcron._log import log
from fleetcron.models import ClaimResult, DefinitionConflict, JobRecord

__all__ = ["Definitions"]


class Definitions:
    """This replica's fingerprint of each job (``local``), and the conflicts it knows of."""

    def __init__(self, local: Mapping[str, str]) -> None:
        self.local = dict(local)
        self.conflicts: dict[str, DefinitionConflict] = {}
        """The jobs whose registered definition is another: this replica does not run them."""
        self.replaced: dict[str, DefinitionConflict] = {}
        """The other definitions this replica replaced when it registered its own."""

    def registered(self, job: str, before: JobRecord | None, now_us: int) -> None:
        """This replica wrote its definition of ``job`` over ``before`` (the row as it was)
        at about ``now_us``."""
        fingerprint = self.local[job]
        if before is None or before.fingerprint in ("", fingerprint):
            return
        self.replaced[job] = DefinitionConflict(
            job=job,
            local_fingerprint=fingerprint,
            other_fingerprint=before.fingerprint,
            since_us=now_us,
        )
        log.warning(
            "job %s: this replica's definition (%s) replaced another replica's (%s); the "
            "stored definition governs: replicas still defining the job as %s do not run it "
            "until they agree",
            job,
            _short(fingerprint),
            _short(before.fingerprint),
            _short(before.fingerprint),
            extra={
                "action": "job_definition_conflict",
                "job": job,
                "local_fingerprint": fingerprint,
                "replaced_fingerprint": before.fingerprint,
            },
        )

    def answered(self, answer: ClaimResult, now_us: int) -> None:
        """Learn from a claim's answer: ``conflict`` names the registered definition; any
        other answer but ``not_due`` (decided before the check) means they agree."""
        if answer.status == "conflict":
            self.stored(answer.job, answer.stored_fingerprint, now_us)
        elif answer.status != "not_due":
            self.stored(answer.job, None, now_us)

    def stored(self, job: str, fingerprint: str | None, now_us: int) -> None:
        """The store holds ``fingerprint`` for ``job`` (``None`` or ``''``: nothing this
        replica disagrees with)."""
        local = self.local.get(job)
        if local is None:
            return
        known = self.conflicts.get(job)
        if not fingerprint or fingerprint == local:
            if known is not None:
                del self.conflicts[job]
                log.info(
                    "job %s: the definitions agree again (%s); this replica runs it again",
                    job,
                    _short(local),
                    extra={"action": "job_definition_agreed", "job": job},
                )
            return
        if known is not None and known.other_fingerprint == fingerprint:
            return
        self.conflicts[job] = DefinitionConflict(
            job=job, local_fingerprint=local, other_fingerprint=fingerprint, since_us=now_us
        )
        log.warning(
            "job %s: another replica registered a different definition (%s, here %s), and "
            "the stored one governs: this replica does not run the job until the "
            "definitions agree",
            job,
            _short(fingerprint),
            _short(local),
            extra={
                "action": "job_definition_conflict",
                "job": job,
                "local_fingerprint": local,
                "stored_fingerprint": fingerprint,
            },
        )


def _short(fingerprint: str) -> str:
    return fingerprint[:12]
