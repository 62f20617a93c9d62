"""A PostgreSQL primary and a streaming standby of the suite's own, for failover faults.

:class:`PostgresPair` starts a :class:`~fault.servers.PostgresCluster` as the primary and a
hot standby made from it with ``pg_basebackup -R -X stream`` (``application_name=s2``),
each on a spare port of 127.0.0.1 with its data in a private temporary directory, run as
the ``postgres`` OS user when we are root. Synchronous (``synchronous_standby_names =
'FIRST 1 (s2)'``, ``synchronous_commit = on``: a commit waits until the standby has flushed
it) or asynchronous (``''``: a commit returns at once and the standby follows).

The replication settings are written with ``ALTER SYSTEM`` on the primary before the base
backup, so the standby inherits them as a real one does: promoted, it still names ``s2`` as
its synchronous standby and every write waits, until :meth:`~PostgresPair.clear_synchronous`
clears the name on the new primary — what Patroni does on a promotion.

The faults, in the order a scenario uses them:

- :meth:`~PostgresPair.cut` — SIGSTOP the primary's walsender: nothing more reaches the
  standby (a synchronous commit now waits; an asynchronous one is acknowledged and exists
  on the primary only). The walsender, not the standby's walreceiver, is stopped: what the
  primary wrote after the cut is then not even in the standby's socket buffer, where a
  walreceiver let go to shut down would still read it.
- :meth:`~PostgresPair.crash_primary` — SIGKILL of the primary's postmaster and every
  process it forked, at once (the stopped walsender included).
- :meth:`~PostgresPair.promote` — ``pg_ctl promote -w`` on the standby: a new WAL timeline.
- :meth:`~PostgresPair.clear_synchronous` — ``ALTER SYSTEM SET synchronous_standby_names =
  ''`` and ``pg_reload_conf()`` on the new primary; returns once a new session sees it.

``standby_offset_s`` starts the standby under libfaketime with its wall clock that many
seconds off (``clock_timestamp()`` and ``now()``; monotonic clocks real), so the promoted
server's clock differs from the old primary's. :attr:`~PostgresPair.url` names both servers
with ``target_session_attrs=read-write``: a client connects to whichever is the primary,
and after a failover finds the promoted standby by connecting again. :meth:`close` stops
both servers by their pids and removes their data (also at exit and by ``with``).
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self

import psycopg

from fault.clock import faketime_env
from fault.servers import (
    PG_BIN,
    START_TIMEOUT_S,
    PostgresCluster,
    ServerError,
    _chown_postgres,
    _descendants,
    _postgres_user,
    _run_logged,
    _Server,
    _signal,
    _stopped,
    wait_until,
)

__all__ = ["STANDBY_NAME", "PostgresPair"]

STANDBY_NAME = "s2"
"""The standby's ``application_name``, which ``synchronous_standby_names`` names."""


def _query(url: str, sql: str, *, timeout: float = 5.0) -> tuple[Any, ...]:
    """One row of ``sql`` on a fresh autocommit connection; the statement is bounded by
    ``statement_timeout`` (a read never waits for a standby)."""
    options = f"-c statement_timeout={int(timeout * 1000)}"
    with psycopg.connect(url, autocommit=True, connect_timeout=2, options=options) as conn:
        row = conn.execute(sql).fetchone()
    if row is None:
        raise ServerError(f"{sql!r} returned no row")
    return tuple(row)


def _dsm_segments(pids: Iterable[int]) -> set[Path]:
    """The POSIX shared memory segments of PostgreSQL (``/dev/shm/PostgreSQL.<n>``) that
    the processes ``pids`` have mapped."""
    found: set[Path] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)  # address perms offset dev inode path
                if len(fields) == 6 and fields[5].startswith("/dev/shm/PostgreSQL."):
                    found.add(Path(fields[5].removesuffix(" (deleted)")))
    return found


class _Standby(PostgresCluster):
    """A hot standby of ``primary``: ``pg_basebackup -R -X stream`` instead of the template
    copy, then the same ``postgres -D`` on a port of its own."""

    def __init__(
        self,
        primary: PostgresCluster,
        directory: Path | None,
        *,
        settings: Mapping[str, str] | None,
        env: Mapping[str, str] | None,
    ) -> None:
        # PostgresCluster.__init__ copies the initdb template: this data comes from the
        # primary instead, so only the common part runs here.
        _Server.__init__(self, directory, env)
        self.settings = {
            **(settings or {}),
            # Written on the command line, not left to -R's primary_conninfo, so the name
            # the primary's synchronous_standby_names waits for is certainly this one.
            "primary_conninfo": (
                f"host=127.0.0.1 port={primary.port} user=postgres application_name={STANDBY_NAME}"
            ),
        }
        self.run_as = _postgres_user()
        try:
            _chown_postgres(self.root)
            self.data = self.root / "data"
            _run_logged(
                [
                    str(PG_BIN / "pg_basebackup"),
                    "--host=127.0.0.1",
                    f"--port={primary.port}",
                    "--username=postgres",
                    f"--pgdata={self.data}",
                    "--write-recovery-conf",  # standby.signal
                    "--wal-method=stream",
                    "--checkpoint=fast",
                    "--no-sync",  # the faults here are process crashes, not power losses
                ],
                "pg_basebackup",
                user=self.run_as,
            )
            self.start()
        except BaseException:
            self.close()
            raise


class PostgresPair:
    """A primary and its streaming standby (see the module docstring).

    ``directory`` receives both servers' logs (kept after :meth:`close`); ``synchronous``
    chooses the replication mode; ``standby_offset_s`` runs the standby's wall clock that
    far off; ``timeout_s`` is the ``timeout`` of :attr:`url` (it bounds every statement,
    and a commit waiting for the standby, of a fleetcron client); ``settings`` are server
    settings of both (``-c name=value``).
    """

    kind = "postgres-pair"

    def __init__(
        self,
        directory: Path | None = None,
        *,
        synchronous: bool = True,
        standby_offset_s: float = 0.0,
        timeout_s: float = 2.0,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.synchronous = synchronous
        self.standby_offset_s = standby_offset_s
        self.timeout_s = timeout_s
        self.standby: _Standby | None = None
        self.walsender_pid: int | None = None
        self._closed = False
        self.primary = PostgresCluster(directory, settings=settings)
        atexit.register(self.close)
        try:
            names = f"FIRST 1 ({STANDBY_NAME})" if synchronous else ""
            self._alter_system(self.primary.url, names)
            env = faketime_env(standby_offset_s) if standby_offset_s else None
            self.standby = _Standby(self.primary, directory, settings=settings, env=env)
            wait_until(self._streaming, START_TIMEOUT_S, "the standby to stream from the primary")
        except BaseException:
            self.close()
            raise

    # -- addresses ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Both servers, the writable one chosen at each connect; ``timeout`` bounds every
        statement (and a commit's wait for the standby)."""
        return f"{self.libpq_url}&timeout={self.timeout_s:g}"

    @property
    def libpq_url(self) -> str:
        """:attr:`url` as libpq takes it (without fleetcron's ``timeout``)."""
        standby = self._standby()
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{standby.port}"
            "/postgres?target_session_attrs=read-write&connect_timeout=2"
        )

    @property
    def primary_url(self) -> str:
        """The first primary alone (it does not come back after :meth:`crash_primary`)."""
        return self.primary.url

    @property
    def standby_url(self) -> str:
        """The standby alone: read-only until :meth:`promote`, the primary after it."""
        return self._standby().url

    def _standby(self) -> _Standby:
        if self.standby is None:
            raise ServerError("the standby was never started")
        return self.standby

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -------------------------------------------------------------------------
    def _streaming(self) -> bool:
        wanted = "sync" if self.synchronous else "async"
        try:
            row = _query(
                self.primary.url,
                "SELECT count(*) FROM pg_stat_replication WHERE application_name = "
                f"'{STANDBY_NAME}' AND state = 'streaming' AND sync_state = '{wanted}'",
            )
        except psycopg.Error:
            return False
        return bool(row[0])

    def timeline(self, url: str | None = None) -> int:
        """The WAL timeline a server writes on (the name of its current WAL file), by
        default the standby's once promoted; 1 until a promotion."""
        row = _query(
            url or self.standby_url,
            "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int",
        )
        return int(row[0])

    def clock_offset_s(self, url: str | None = None) -> float:
        """How far the server's wall clock (``clock_timestamp()``) is from this process's,
        by default the standby's: negative when it is behind (half the round trip taken
        off)."""
        asked = time.time()
        row = _query(url or self.standby_url, "SELECT extract(epoch FROM clock_timestamp())")
        heard = time.time()
        return float(row[0]) - (asked + heard) / 2

    def in_recovery(self) -> bool:
        """Whether the standby is still a standby."""
        return bool(_query(self.standby_url, "SELECT pg_is_in_recovery()")[0])

    def received_lsn(self) -> str:
        """The last WAL position the standby received (``pg_last_wal_receive_lsn()``)."""
        return str(_query(self.standby_url, "SELECT pg_last_wal_receive_lsn()::text")[0])

    def primary_lsn(self) -> str:
        """The primary's current WAL write position."""
        return str(_query(self.primary.url, "SELECT pg_current_wal_lsn()::text")[0])

    def replayed(self) -> bool:
        """Whether the standby has replayed all the WAL it received (what a promotion
        would start from, once the primary is gone)."""
        row = _query(
            self.standby_url, "SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()"
        )
        return bool(row[0])

    def lsn_diff(self, later: str, earlier: str) -> int:
        """``later - earlier`` in bytes of WAL (``pg_wal_lsn_diff``), on the standby."""
        row = _query(self.standby_url, f"SELECT pg_wal_lsn_diff('{later}', '{earlier}')::bigint")
        return int(row[0])

    # -- faults ------------------------------------------------------------------------
    def cut(self) -> int:
        """SIGSTOP the primary's walsender to the standby; returns its pid once stopped.
        Nothing the primary writes from now on reaches the standby."""
        row = _query(
            self.primary.url,
            f"SELECT pid FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}'",
        )
        pid = int(row[0])
        _signal(pid, signal.SIGSTOP)
        wait_until(lambda: _stopped(pid), 10, "the walsender to stop on SIGSTOP")
        self.walsender_pid = pid
        return pid

    def heal(self) -> None:
        """SIGCONT the walsender :meth:`cut` stopped (the standby catches up)."""
        if self.walsender_pid is not None:
            _signal(self.walsender_pid, signal.SIGCONT)
            self.walsender_pid = None

    def cancel_sync_waits(self) -> int:
        """``pg_cancel_backend`` every fleetcron session of the primary whose commit waits
        for the standby (``wait_event = 'SyncRep'``); how many were signalled. PostgreSQL
        then ends the wait with a WARNING ("canceling wait for synchronous replication")
        and reports the commit done, though the standby may never have it."""
        row = _query(
            self.primary.url,
            "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity "
            "WHERE wait_event = 'SyncRep' AND application_name = 'fleetcron'",
        )
        return int(row[0])

    def crash_primary(self) -> None:
        """SIGKILL the primary's postmaster and every process it forked, at once; then
        remove the dynamic shared memory segments they had mapped, which a postmaster
        removes when it exits or starts again on the same data — this one does neither, and
        each would otherwise stay in /dev/shm (about half a megabyte per crash)."""
        root = self.primary.pid
        segments = _dsm_segments([root, *_descendants(root)])
        self.primary.kill9()
        self.walsender_pid = None
        for segment in segments:
            segment.unlink(missing_ok=True)

    def promote(self, timeout: float = START_TIMEOUT_S) -> None:
        """``pg_ctl promote -w``: the standby ends recovery on a new timeline and takes
        writes (which still wait for ``s2`` until :meth:`clear_synchronous`)."""
        standby = self._standby()
        _run_logged(
            [
                str(PG_BIN / "pg_ctl"),
                "promote",
                "--pgdata",
                str(standby.data),
                "--wait",
                "--timeout",
                str(int(timeout)),
            ],
            "pg_ctl promote",
            user=standby.run_as,
        )

    def clear_synchronous(self) -> None:
        """Clear ``synchronous_standby_names`` on the promoted standby (ALTER SYSTEM and a
        reload, as Patroni does): the commits waiting for ``s2`` are released, and new ones
        no longer wait. Returns once a new session sees the empty setting."""
        self._alter_system(self.standby_url, "")

    def _alter_system(self, url: str, names: str) -> None:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            conn.execute("SELECT pg_reload_conf()")

        def applied() -> bool:
            row = _query(url, "SELECT current_setting('synchronous_standby_names')")
            return str(row[0]) == names

        wait_until(applied, 30, f"synchronous_standby_names = {names!r} to apply")

    # -- the end -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop both servers (by their pids, whatever their state) and remove their data;
        idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self.standby is not None:
                self.standby.close()
        finally:
            self.primary.close()
