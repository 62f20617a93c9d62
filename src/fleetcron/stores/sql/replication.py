"""PostgreSQL replication, as fleetcron sees it: the notice that turns an acknowledged
commit into a write that may be lost at a failover, the URL defaults of a multi-host
deployment, and what ``fleetcron doctor`` reports of the replication mode
(:meth:`PostgresStore.doctor_facts <fleetcron.stores.sql.postgres.PostgresStore.doctor_facts>`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from fleetcron.doctor.findings import Finding
from fleetcron.errors import StoreUnavailable
from fleetcron.stores.url import StoreURL

__all__ = [
    "FENCE_TIMELINE_SHIFT",
    "REPLICATION_QUERY",
    "ReplicationFacts",
    "ReplicationUnknown",
    "UnreplicatedCommits",
    "multi_host",
    "replication_facts",
    "session_defaults",
]

FENCE_TIMELINE_SHIFT = 40
"""Fences on PostgreSQL are ``clock_us + (timeline - 1) << 40`` (migration 16): a promoted
standby's fences stay above the old primary's unless its clock is 2^40 µs (12.7 days)
behind."""

# Both of PostgreSQL's messages for a commit that stopped waiting for its synchronous
# standby: "canceling wait for synchronous replication due to user request" (a cancel
# request: pg_cancel_backend, a pooler's query_timeout) and "canceling the wait for
# synchronous replication and terminating connection due to administrator command". The
# transaction is committed on the primary and visible there, but no standby is known to
# have it: a failover can lose it. The messages carry no SQLSTATE of their own (the first
# is a plain 01000 warning), so they are known by their text, which is English unless the
# server's lc_messages says otherwise (doctor warns then).
_SYNC_WAIT_CANCELLED = re.compile(r"wait for synchronous replication", re.IGNORECASE)


class UnreplicatedCommits:
    """The notice handler of one connection: remembers a commit whose wait for a
    synchronous standby was cancelled, until the statement's caller asks."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: str | None = None

    def notice(self, diagnostic: Any) -> None:
        """psycopg's notice handler (``Connection.add_notice_handler``)."""
        message = diagnostic.message_primary or ""
        if diagnostic.severity_nonlocalized == "WARNING" and _SYNC_WAIT_CANCELLED.search(message):
            self._seen = message

    def forget(self) -> None:
        """Drop what a statement before this one left (a new statement starts)."""
        self._seen = None

    def check(self, url: StoreURL) -> None:
        """Raise :class:`StoreUnavailable` if the statement just run committed without its
        synchronous standby: what it wrote may vanish at a failover, so it counts as not
        written (a claim did not happen, an outcome is written again)."""
        seen, self._seen = self._seen, None
        if seen is not None:
            raise StoreUnavailable(
                f"{url.redacted}: a write was committed on the primary without its "
                f"synchronous standby ({seen!r}); a failover could lose it, so it is taken "
                "as not written"
            )


def multi_host(url: StoreURL) -> bool:
    """Whether ``url`` names more than one server (``h1:p1,h2:p2`` or ``?host=h1,h2``)."""
    try:
        hosts = conninfo_to_dict(url.driver_url).get("host") or ""
    except psycopg.Error:  # refused before connecting, by check_conninfo
        return False
    return "," in str(hosts)


def session_defaults(url: StoreURL) -> dict[str, str]:
    """Connection parameters a multi-host URL gets unless it sets them: the writable server
    (``target_session_attrs=read-write``), not the first to answer, which after a failover
    may be the old primary come back as a standby."""
    if not multi_host(url) or "target_session_attrs" in conninfo_to_dict(url.driver_url):
        return {}
    return {"target_session_attrs": "read-write"}


# Read by ``fleetcron doctor`` in one statement. pg_stat_replication shows a role without
# pg_read_all_stats its standbys' names only (state and sync_state are NULL for it).
REPLICATION_QUERY = """
SELECT pg_is_in_recovery(),
       current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       current_setting('lc_messages'),
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
       END,
       (SELECT coalesce(json_agg(json_build_array(application_name, state, sync_state)), '[]')
          FROM pg_stat_replication)::text
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicationFacts:
    """The replication mode of the server a PostgreSQL store writes to.

    ``standbys`` are ``(application_name, state, sync_state)`` from
    ``pg_stat_replication``; ``state`` and ``sync_state`` are ``None`` when the role may not
    see them. ``timeline`` is the server's WAL timeline (``None`` on a standby).
    """

    in_recovery: bool
    synchronous_commit: str
    synchronous_standby_names: str
    lc_messages: str
    timeline: int | None
    standbys: tuple[tuple[str, str | None, str | None], ...]
    multi_host: bool = False

    def findings(self) -> list[Finding]:
        """The replication mode and what a failover may cost, one finding (two when the
        server's messages are not in English under synchronous replication)."""
        findings = [self._mode()]
        if self._synchronous() and not _english(self.lc_messages):
            findings.append(
                Finding(
                    level="warn",
                    check="postgres (replication)",
                    message=f"lc_messages is {self.lc_messages!r}: fleetcron knows a commit "
                    "whose wait for the synchronous standby was cancelled by PostgreSQL's "
                    "English notice",
                    advice="set lc_messages = 'C' (or an English locale) for fleetcron's "
                    "role: ALTER ROLE … SET lc_messages = 'C'",
                )
            )
        return findings

    def _synchronous(self) -> bool:
        return bool(self.synchronous_standby_names.strip()) and self.synchronous_commit not in (
            "off",
            "local",
        )

    def _mode(self) -> Finding:
        check = "postgres (replication)"
        names = ", ".join(name for name, _, _ in self.standbys) or "none"
        timeline = f"timeline {self.timeline}" if self.timeline is not None else ""
        if self.in_recovery:
            return Finding(
                level="fail",
                check=check,
                message="the server is a standby (in recovery): it refuses every write",
                advice="point the backend URL at the primary; with several hosts, add "
                "target_session_attrs=read-write",
            )
        lost = (
            "a failover can lose writes the primary acknowledged: a slot claimed or "
            "finished just before it loses its ledger row, and can run again or be left "
            "unrecorded (exactly once does not hold across it). "
            "Fences stay increasing: they hold the WAL timeline, which a promotion raises, "
            "unless the promoted standby's clock is 12.7 days behind"
        )
        if self._synchronous():
            synced = [name for name, _, sync in self.standbys if sync in ("sync", "quorum")]
            unknown = all(sync is None for _, _, sync in self.standbys)
            waiting = not self.standbys or (not synced and not unknown)
            if waiting:
                return Finding(
                    level="warn",
                    check=check,
                    message=f"synchronous (synchronous_standby_names = "
                    f"{self.synchronous_standby_names!r}), but no synchronous standby is "
                    f"connected (standbys: {names}): every write waits",
                    advice="each write waits for a standby until the backend URL's timeout, "
                    "then fails; bring the standby back, or let the HA manager (Patroni) "
                    "clear synchronous_standby_names",
                )
            return Finding(
                level="ok",
                check=check,
                message=f"synchronous: synchronous_commit {self.synchronous_commit}, "
                f"synchronous_standby_names {self.synchronous_standby_names!r}, standbys: "
                f"{names}" + (f", {timeline}" if timeline else ""),
                advice="a failover onto a synchronous standby keeps every write fleetcron "
                "was told was done: the guarantees hold across it (docs/ha.md)"
                + (
                    ""
                    if self.multi_host
                    else "; the backend URL names one host: after a failover it must reach "
                    "the new primary (list both, h1:5432,h2:5432, or a name the HA manager "
                    "moves)"
                ),
            )
        if not self.standbys and not self.synchronous_standby_names.strip():
            return Finding(
                level="ok",
                check=check,
                message="one server, no standby connected" + (f" ({timeline})" if timeline else ""),
                advice="a server lost is restored from a backup, which loses what came after "
                "it; a standby with synchronous replication keeps every acknowledged write "
                "(docs/ha.md)",
            )
        return Finding(
            level="warn",
            check=check,
            message=f"asynchronous: synchronous_commit {self.synchronous_commit}, "
            f"synchronous_standby_names {self.synchronous_standby_names!r}, standbys: {names}",
            advice=f"{lost}. Set synchronous_standby_names (Patroni: synchronous_mode) to "
            "keep every acknowledged write (docs/ha.md)",
        )


@dataclass(frozen=True, slots=True)
class ReplicationUnknown:
    """The replication mode could not be read: ``error``."""

    error: str

    def findings(self) -> list[Finding]:
        return [
            Finding(
                level="warn",
                check="postgres (replication)",
                message=f"cannot tell: {self.error}",
                advice="fleetcron's role reads pg_is_in_recovery(), pg_stat_replication and "
                "two settings; without them doctor cannot say what a failover costs",
            )
        ]


def _english(lc_messages: str) -> bool:
    name = lc_messages.strip().lower()
    return name in ("", "c", "posix") or name.startswith(("en_", "en.", "c.")) or name == "en"


def replication_facts(row: tuple[Any, ...], *, multi: bool) -> ReplicationFacts:
    """:class:`ReplicationFacts` from the row of :data:`REPLICATION_QUERY`."""
    in_recovery, commit, names, messages, timeline, standbys = row
    return ReplicationFacts(
        in_recovery=bool(in_recovery),
        synchronous_commit=str(commit),
        synchronous_standby_names=str(names or ""),
        lc_messages=str(messages or ""),
        timeline=None if timeline is None else int(timeline),
        standbys=tuple(
            (str(name or ""), state, sync) for name, state, sync in json.loads(standbys or "[]")
        ),
        multi_host=multi,
    )
