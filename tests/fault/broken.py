"""Negative controls: obviously broken stand-ins that make real histories, and the same
schedules of faults run on fleetcron itself.

The checker is only worth something if it catches what is wrong. Each control runs real
processes (``multiprocessing`` from a fork server, and a job command under ``subprocess``)
against a real store — a SQLite file, or PostgreSQL for the locks when a URL is given (in
tables of a unique name, dropped afterwards) — under one schedule of faults, once with the
broken stand-in and once with fleetcron:

(a) :func:`client_clock_control` — a lock that trusts the client's clock: acquire reads the
    row's expiry and compares it with the *client's* ``time.time()``. Worker A holds the
    lock; worker B, whose clock runs 120 s ahead (an injected clock function, and for
    fleetcron a :class:`~fleetcron.clock.Clock` — the only way fleetcron reads wall time),
    tries to take it. Broken: B is granted while A holds (``overlap``). fleetcron: B is
    refused.
(b) :func:`ownerless_release_control` — a release without the owner check (``DELETE …
    WHERE name = ?``). A's short lease expires, B takes the lock, A's late release comes,
    then C tries; C writes to the protected resource, then B does. Broken (with a resource
    that does not check fences either): C is granted while B holds (``overlap``) and B's
    write with the lower fence is accepted after C's (``stale_write``). fleetcron (with the
    fence-checking :class:`~fault.protected.ProtectedResource`): A's release is refused as
    not ours, C is refused, B's write is accepted. (The broken lock with a fence-checking
    resource: still ``overlap``, but B's stale write is rejected — no ``stale_write``.)
(c) :func:`late_kill_control` — a scheduler that kills late: it gives the job a grace
    *after* the lease's end. The job (a child process) logs ``run_alive`` until it is
    killed or its work is done, and its work outlasts the lease (no keepalive). Broken: the
    job is alive after the lease expired in the store (``alive_after_expiry``). fleetcron
    (``fleetcron exec``'s :func:`~fleetcron.cli.exec.run_exec`, which stops the command a
    grace before the local deadline and kills it at the deadline): no sign of life after
    the expiry.

Each returns the merged history; ``tests/fault/test_checker.py`` feeds it to the checker.
Workers wait for each other on ``multiprocessing`` events, never on fixed sleeps; the only
sleeps are parts of the behaviour (a poll between acquire attempts, a job's pace).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.synchronize import Event as SyncEvent
from pathlib import Path
from typing import Any, Protocol

from fault.history import Event, HistoryWriter, read_history
from fault.protected import ProtectedResource
from fleetcron import Fleet
from fleetcron.cli.exec import ExecOptions, run_exec
from fleetcron.clock import Clock
from fleetcron.durations import DurationLike
from fleetcron.keepalive import effective_grace_us
from fleetcron.lease import Lease, LockMode

__all__ = [
    "CLIENT_OFFSET_S",
    "ControlFailed",
    "Grant",
    "NaiveLock",
    "OffsetClock",
    "UncheckedResource",
    "client_clock_control",
    "late_kill_control",
    "ownerless_release_control",
]

CLIENT_OFFSET_S = 120.0
"""How far ahead worker B's clock runs in control (a)."""
TIMEOUT_S = 60.0
"""The bound on every wait of a control (generous: CI machines are loaded)."""
_REPO = Path(__file__).resolve().parents[2]
_LOCK = "control-lock"


class ControlFailed(RuntimeError):
    """A control did not run its schedule (a worker failed or a wait timed out)."""


# -- the stand-ins --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Grant:
    """A granted lock: the fence, the grant's store time, the expiry the store holds, the
    holder's token, and the implementation's own handle."""

    name: str
    fence: int
    acquired_us: int
    expires_us: int
    holder: str
    handle: Any = None


class LockClient(Protocol):
    """What a control's workers drive: fleetcron, or a broken stand-in."""

    def acquire(self, name: str, ttl_us: int) -> Grant | None:
        """Take ``name`` for ``ttl_us``, or ``None`` when another holder has it."""
        ...

    def release(self, grant: Grant) -> bool:
        """Give it back; whether the store still knew it as ours."""
        ...

    def close(self) -> None:
        """Let go of the connection."""
        ...


class _Sql:
    """A connection to SQLite (``sqlite:////abs/path``) or PostgreSQL (``postgresql://…``) with
    one serialised transaction at a time and the store's clock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = url.startswith(("postgresql://", "postgres://"))
        self._pg: Any = None
        self._lite: sqlite3.Connection | None = None
        if self.postgres:
            import psycopg

            self._pg = psycopg.connect(url, autocommit=True)
        else:
            path = url.removeprefix("sqlite:///")
            self._lite = sqlite3.connect(path, timeout=TIMEOUT_S, isolation_level=None)

    @contextlib.contextmanager
    def transaction(self, lock_table: str) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
        """A write transaction that excludes every other one on ``lock_table``; yields
        ``query(sql, *params) -> rows`` (``?`` placeholders)."""
        if self._pg is not None:
            pg = self._pg

            def pg_query(sql: str, *params: object) -> list[tuple[Any, ...]]:
                cursor = pg.execute(sql.replace("?", "%s"), params)
                return list(cursor.fetchall()) if cursor.description else []

            with pg.transaction():
                pg.execute(f"LOCK TABLE {lock_table} IN SHARE ROW EXCLUSIVE MODE")
                yield pg_query
            return
        lite = self._lite
        assert lite is not None

        def lite_query(sql: str, *params: object) -> list[tuple[Any, ...]]:
            return list(lite.execute(sql, params).fetchall())

        lite.execute("BEGIN IMMEDIATE")
        try:
            yield lite_query
            lite.execute("COMMIT")
        except BaseException:
            lite.execute("ROLLBACK")
            raise

    def now_us(self, query: Callable[..., list[tuple[Any, ...]]]) -> int:
        """The store's clock (µs), read inside the transaction."""
        if self.postgres:
            sql = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
        else:  # what fleetcron's SQLite store reads: SQLite's 'now', in ms
            sql = (
                "SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000"
            )
        return int(query(sql)[0][0])

    def execute(self, sql: str) -> None:
        """One statement outside a transaction (DDL)."""
        if self._pg is not None:
            self._pg.execute(sql)
        else:
            assert self._lite is not None
            self._lite.execute(sql)

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
        if self._lite is not None:
            self._lite.close()


class NaiveLock:
    """A lease table anyone would write in an afternoon — and get wrong in one of two ways.

    ``client_clock``: judge the row's expiry by this function (the client's ``time.time``)
    instead of the store's clock, and write the new expiry by it too (control a).
    ``owner_check=False``: release deletes the row by name, whoever holds it (control b).
    With neither, it is a correct (if plain) lock. Fences come from a counter table, so
    they increase even when a row is deleted.
    """

    def __init__(
        self,
        url: str,
        table: str,
        *,
        client_clock: Callable[[], float] | None = None,
        owner_check: bool = True,
    ) -> None:
        self.table = table
        self.client_clock = client_clock
        self.owner_check = owner_check
        self._db = _Sql(url)

    @staticmethod
    def create(url: str, table: str) -> None:
        """Create the lock's two tables."""
        db = _Sql(url)
        try:
            db.execute(
                f"CREATE TABLE {table} (name TEXT PRIMARY KEY, holder TEXT NOT NULL, "
                "fence BIGINT NOT NULL, expires_us BIGINT NOT NULL)"
            )
            db.execute(f"CREATE TABLE {table}_fence (name TEXT PRIMARY KEY, fence BIGINT NOT NULL)")
        finally:
            db.close()

    @staticmethod
    def drop(url: str, table: str) -> None:
        """Drop the lock's tables."""
        db = _Sql(url)
        try:
            db.execute(f"DROP TABLE IF EXISTS {table}")
            db.execute(f"DROP TABLE IF EXISTS {table}_fence")
        finally:
            db.close()

    def acquire(self, name: str, ttl_us: int) -> Grant | None:
        """Read the row; if it has expired (by the judging clock), take it."""
        holder = uuid.uuid4().hex
        with self._db.transaction(self.table) as query:
            store_now = self._db.now_us(query)
            judge = store_now if self.client_clock is None else int(self.client_clock() * 1e6)
            rows = query(f"SELECT expires_us FROM {self.table} WHERE name = ?", name)
            if rows and int(rows[0][0]) > judge:
                return None
            counter = query(f"SELECT fence FROM {self.table}_fence WHERE name = ?", name)
            fence = (int(counter[0][0]) if counter else 0) + 1
            query(
                f"INSERT INTO {self.table}_fence (name, fence) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET fence = excluded.fence",
                name,
                fence,
            )
            expires = judge + ttl_us
            query(
                f"INSERT INTO {self.table} (name, holder, fence, expires_us) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
                "fence = excluded.fence, expires_us = excluded.expires_us",
                name,
                holder,
                fence,
                expires,
            )
        return Grant(
            name=name, fence=fence, acquired_us=store_now, expires_us=expires, holder=holder
        )

    def release(self, grant: Grant) -> bool:
        """Delete the row — only if it is still ours, unless ``owner_check`` is off."""
        name = grant.name
        with self._db.transaction(self.table) as query:
            if self.owner_check:
                rows = query(
                    f"SELECT name FROM {self.table} WHERE name = ? AND holder = ?",
                    name,
                    grant.holder,
                )
                query(f"DELETE FROM {self.table} WHERE name = ? AND holder = ?", name, grant.holder)
            else:
                rows = query(f"SELECT name FROM {self.table} WHERE name = ?", name)
                query(f"DELETE FROM {self.table} WHERE name = ?", name)
        return bool(rows)

    def close(self) -> None:
        self._db.close()


class OffsetClock:
    """A :class:`~fleetcron.clock.Clock` whose wall time runs ``offset_s`` ahead (the
    monotonic clock is the real one)."""

    def __init__(self, offset_s: float) -> None:
        self.offset_us = round(offset_s * 1e6)

    def monotonic_us(self) -> int:
        return time.monotonic_ns() // 1000

    def wall_us(self) -> int:
        return time.time_ns() // 1000 + self.offset_us


class _FleetcronLock:
    """fleetcron's lock API behind :class:`LockClient`."""

    def __init__(self, url: str, namespace: str, clock: Clock) -> None:
        self.fleet = Fleet(url, namespace=namespace, clock=clock)

    def acquire(self, name: str, ttl_us: int) -> Grant | None:
        lease = self.fleet.try_lock(
            name, lock_at_most=timedelta(microseconds=ttl_us), keepalive=False
        )
        if lease is None:
            return None
        record = lease.record
        return Grant(
            name=name,
            fence=lease.fence,
            acquired_us=record.acquired_us,
            expires_us=record.expires_us,
            holder=lease.holder,
            handle=lease,
        )

    def release(self, grant: Grant) -> bool:
        lease = grant.handle
        assert isinstance(lease, Lease)
        return lease.release()

    def close(self) -> None:
        self.fleet.close()


class UncheckedResource(ProtectedResource):
    """A protected resource that does not check fences: it accepts every write."""

    def accepts(self, fence: int, highest: int | None) -> bool:
        return True


# -- the workers ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _LockPlan:
    """What one lock worker does: its lock, its clock offset and its steps."""

    worker: str
    history: str
    url: str
    broken: bool
    table: str = ""
    namespace: str = ""
    offset_s: float = 0.0
    client_clock: bool = False
    owner_check: bool = True
    resource: str = ""
    check_fences: bool = True
    steps: tuple[tuple[Any, ...], ...] = field(default_factory=tuple)


def _lock_client(plan: _LockPlan) -> LockClient:
    if not plan.broken:
        return _FleetcronLock(plan.url, plan.namespace, OffsetClock(plan.offset_s))
    offset = plan.offset_s

    def client_time() -> float:  # the injected clock of the worker
        return time.time() + offset

    return NaiveLock(
        plan.url,
        plan.table,
        client_clock=client_time if plan.client_clock else None,
        owner_check=plan.owner_check,
    )


def _lock_worker(plan: _LockPlan, signals: dict[str, SyncEvent]) -> None:
    """Run ``plan.steps`` in this process, logging every operation to its history."""
    writer = HistoryWriter(plan.history, plan.worker)
    lock = _lock_client(plan)
    resource: ProtectedResource | None = None
    if plan.resource:
        kind = ProtectedResource if plan.check_fences else UncheckedResource
        resource = kind(plan.resource)
    held: Grant | None = None

    def acquire(ttl_s: float) -> Grant | None:
        writer.log("acquire_invoke", _LOCK)
        try:
            grant = lock.acquire(_LOCK, round(ttl_s * 1e6))
        except Exception as exc:
            writer.log("acquire_error", _LOCK, error=repr(exc))
            raise
        if grant is None:
            writer.log("acquire_refused", _LOCK)
        else:
            writer.log(
                "acquire_ok",
                _LOCK,
                fence=grant.fence,
                store_us=grant.acquired_us,
                expires_us=grant.expires_us,
                holder=grant.holder,
            )
        return grant

    try:
        for step in plan.steps:
            what = step[0]
            if what == "wait":
                if not signals[step[1]].wait(TIMEOUT_S):
                    raise ControlFailed(f"{plan.worker}: no {step[1]!r} in {TIMEOUT_S} s")
            elif what == "set":
                signals[step[1]].set()
            elif what == "acquire":
                held = acquire(step[1])
                if held is None and step[2]:
                    raise ControlFailed(f"{plan.worker}: the lock was refused")
            elif what == "acquire_until_granted":
                give_up = time.monotonic() + TIMEOUT_S
                while (held := acquire(step[1])) is None:
                    if time.monotonic() > give_up:
                        raise ControlFailed(f"{plan.worker}: never granted")
                    time.sleep(0.01)  # a poll between attempts
            elif what == "release" and held is not None:
                writer.log("release_invoke", _LOCK, fence=held.fence)
                released = lock.release(held)
                writer.log("release_ok" if released else "release_lost", _LOCK, fence=held.fence)
                writer.log("stopped", _LOCK, fence=held.fence)
                held = None
            elif what == "write" and held is not None:
                assert resource is not None
                writer.log("alive", _LOCK, fence=held.fence)
                resource.write(writer, _LOCK, held.fence)
    finally:
        lock.close()
        writer.close()
        if resource is not None:
            resource.close()


_PRELOAD = [
    "__main__",
    "fleetcron.fleet",
    "fleetcron.sync",
    "fleetcron.cli.exec",
    "psycopg",
    "fault.broken",
]


def _context() -> multiprocessing.context.ForkServerContext:
    """Workers are forked from a fork server that has imported the caller's main module,
    fleetcron, the store drivers and this module once: a clean single-threaded parent, and
    a start in milliseconds instead of a second of imports per worker."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    # Python 3.11's fork server ignores the parent's sys.path: give it ours through the
    # environment it starts with, or its preload of this module would fail.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(_REPO / "tests"), str(_REPO / "src"), *([saved] if saved else [])]
    )
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    return context


def _run(
    workers: Sequence[tuple[Callable[..., None], tuple[Any, ...]]], names: Sequence[str]
) -> None:
    """Start every worker in a process of its own and wait for all; as soon as one fails
    (or the bound passes), stop the others and raise :class:`ControlFailed`."""
    context = _context()
    processes = [context.Process(target=target, args=args) for target, args in workers]
    for process in processes:
        process.start()
    try:
        give_up = time.monotonic() + 2 * TIMEOUT_S
        running = dict(zip(names, processes, strict=True))
        while running:
            left = give_up - time.monotonic()
            if left <= 0:
                raise ControlFailed(f"workers {sorted(running)} did not finish")
            multiprocessing.connection.wait([p.sentinel for p in running.values()], left)
            for name, process in list(running.items()):
                if process.exitcode is None:
                    continue
                del running[name]
                if process.exitcode != 0:
                    raise ControlFailed(f"worker {name} failed (exit {process.exitcode})")
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()


def _signals(*names: str) -> dict[str, SyncEvent]:
    context = _context()
    return {name: context.Event() for name in names}


@contextlib.contextmanager
def _store(workdir: Path, broken: bool, pg_url: str | None) -> Iterator[tuple[str, str, str]]:
    """``(url, naive table, fleetcron namespace)`` for one run; the tables go afterwards."""
    tag = uuid.uuid4().hex[:12]
    url = pg_url or f"sqlite:///{workdir / f'store-{tag}.db'}"
    table = f"fault_naive_{tag}"
    if broken:
        NaiveLock.create(url, table)
    try:
        yield url, table, f"fault-control-{tag}"
    finally:
        if broken:
            NaiveLock.drop(url, table)


def _lock_control(
    workdir: Path,
    broken: bool,
    pg_url: str | None,
    plans: Sequence[dict[str, Any]],
    signal_names: Sequence[str],
) -> list[Event]:
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    with _store(workdir, broken, pg_url) as (url, table, namespace):
        signals = _signals(*signal_names)
        built = [
            _LockPlan(
                history=str(workdir / f"history-{tag}-{plan['worker']}.jsonl"),
                url=url,
                broken=broken,
                table=table,
                namespace=namespace,
                resource=str(workdir / f"protected-{tag}.db"),
                **plan,
            )
            for plan in plans
        ]
        ProtectedResource(built[0].resource).close()  # created before the workers race
        _run([(_lock_worker, (plan, signals)) for plan in built], [p.worker for p in built])
        return read_history(plan.history for plan in built)


def client_clock_control(workdir: Path, *, broken: bool, pg_url: str | None = None) -> list[Event]:
    """Control (a): A holds the lock (30 s); B, whose clock runs :data:`CLIENT_OFFSET_S`
    ahead, tries to take it; then A releases. ``broken``: the lock judges expiry by the
    client's clock; else fleetcron with B's :class:`OffsetClock`. SQLite in ``workdir``
    unless ``pg_url``."""
    plans: list[dict[str, Any]] = [
        {
            "worker": "A",
            "client_clock": True,
            "steps": (
                ("acquire", 30.0, True),
                ("set", "a_holds"),
                ("wait", "b_done"),
                ("release",),
            ),
        },
        {
            "worker": "B",
            "client_clock": True,
            "offset_s": CLIENT_OFFSET_S,
            "steps": (
                ("wait", "a_holds"),
                ("acquire", 30.0, False),
                ("release",),
                ("set", "b_done"),
            ),
        },
    ]
    return _lock_control(workdir, broken, pg_url, plans, ("a_holds", "b_done"))


def ownerless_release_control(
    workdir: Path, *, broken: bool, pg_url: str | None = None, check_fences: bool | None = None
) -> list[Event]:
    """Control (b): A takes the lock for 0.3 s; once it has expired B takes it (30 s);
    A's late release comes; C tries, and if granted writes to the protected resource;
    then B writes and releases. ``broken``: release without the owner check; else
    fleetcron. ``check_fences``: whether the resource checks fences
    (:class:`ProtectedResource`) or not (:class:`UncheckedResource`); by default it does
    exactly when the lock is fleetcron."""
    checks = not broken if check_fences is None else check_fences
    plans: list[dict[str, Any]] = [
        {
            "worker": "A",
            "owner_check": not broken,
            "steps": (
                ("acquire", 0.3, True),
                ("set", "a_holds"),
                ("wait", "b_holds"),
                ("release",),  # late: its lease expired and B holds
                ("set", "a_released"),
            ),
        },
        {
            "worker": "B",
            "owner_check": not broken,
            "check_fences": checks,
            "steps": (
                ("wait", "a_holds"),
                ("acquire_until_granted", 30.0),
                ("set", "b_holds"),
                ("wait", "c_done"),
                ("write",),
                ("release",),
            ),
        },
        {
            "worker": "C",
            "owner_check": not broken,
            "check_fences": checks,
            "steps": (
                ("wait", "a_released"),
                ("acquire", 30.0, False),
                ("write",),
                ("release",),
                ("set", "c_done"),
            ),
        },
    ]
    return _lock_control(
        workdir, broken, pg_url, plans, ("a_holds", "b_holds", "a_released", "c_done")
    )


# -- control (c): the scheduler that kills late ----------------------------------------------
LEASE_S = 1.5
"""The job's lease in control (c): no keepalive, so it ends ``LEASE_S`` after the grant."""
WORK_S = 2.5
"""How long the job of control (c) works if nobody stops it (longer than the lease)."""
KILL_GRACE_S = 0.25
"""The stop grace: fleetcron's SIGTERM comes this long before its local deadline; the
broken scheduler grants ``LEASE_S`` of grace *after* the lease's end."""


def _job_env(history: Path, worker: str) -> dict[str, str]:
    path = os.pathsep.join([str(_REPO / "tests"), str(_REPO / "src")])
    return {
        "PYTHONPATH": path,
        "FAULT_HISTORY": str(history),
        "FAULT_WORKER": worker,
        "FAULT_WORK_S": str(WORK_S),
    }


_JOB_BODY = """
import os, time
from fault.history import HistoryWriter

fence = int(os.environ["FLEETCRON_FENCE"])
name = os.environ["FLEETCRON_JOB"]
with HistoryWriter(os.environ["FAULT_HISTORY"], os.environ["FAULT_WORKER"]) as writer:
    writer.log("run_start", name, fence=fence)
    until = time.monotonic() + float(os.environ["FAULT_WORK_S"])
    while True:
        writer.log("run_alive", name, fence=fence)
        if time.monotonic() >= until:
            break
        time.sleep(0.01)
    writer.log("run_end", name, fence=fence, outcome="ok")
"""
"""The job of control (c): ``run_start``, then ``run_alive`` every 10 ms (its pace) until
its work is done or it is killed, then ``run_end``. It imports only :mod:`fault.history`,
so it starts at once; its arguments come from the environment."""


def _job_command() -> list[str]:
    return [sys.executable, "-c", _JOB_BODY]


class _LoggingFleet(Fleet):
    """A fleet that logs its grants in a history (what ``fleetcron exec`` does with its
    lease is then visible to the checker)."""

    writer: HistoryWriter

    def try_lock(
        self,
        name: str,
        *,
        lock_at_most: DurationLike = "30s",
        lock_at_least: DurationLike = 0,
        keepalive: bool = True,
        wait: DurationLike | None = None,
        mode: LockMode = "lease",
    ) -> Lease | None:
        self.writer.log("acquire_invoke", name)
        lease = super().try_lock(
            name,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            keepalive=keepalive,
            wait=wait,
            mode=mode,
        )
        if lease is None:
            self.writer.log("acquire_refused", name)
        else:
            _log_grant(self.writer, name, lease)
        return lease


def _log_grant(writer: HistoryWriter, name: str, lease: Lease) -> None:
    writer.log(
        "acquire_ok",
        name,
        fence=lease.fence,
        store_us=lease.record.acquired_us,
        expires_us=lease.record.expires_us,
        holder=lease.holder,
    )


def _scheduler_worker(
    broken: bool, url: str, namespace: str, history: str, job_history: str
) -> None:
    """One replica running the job once under its lease: fleetcron's ``run_exec``, or the
    broken scheduler that kills late."""
    worker = "replica-1"
    writer = HistoryWriter(history, worker)
    os.environ.update(_job_env(Path(job_history), worker))
    try:
        if broken:
            _kill_late(writer, url, namespace)
            return
        fleet = _LoggingFleet(url, namespace=namespace)
        fleet.writer = writer
        with fleet:
            options = ExecOptions(
                name=_JOB,
                command=tuple(_job_command()),
                lock_at_most=f"{round(LEASE_S * 1000)}ms",
                lock_at_least="0s",
                keepalive=False,
                timeout_us=None,
                wait=None,
                skipped_exit_code=75,
                kill_grace_us=effective_grace_us(round(KILL_GRACE_S * 1e6), round(LEASE_S * 1e6)),
            )
            status = run_exec(fleet, options, url)
        writer.log("stopped", _JOB, status=status)
    finally:
        writer.close()


_JOB = "control-job"


def _kill_late(writer: HistoryWriter, url: str, namespace: str) -> None:
    """The broken scheduler: the lease's end is counted from when the grant was *heard*,
    and the job gets a grace after it before it is killed."""
    with Fleet(url, namespace=namespace) as fleet:
        writer.log("acquire_invoke", _JOB)
        lease = fleet.try_lock(_JOB, lock_at_most=timedelta(seconds=LEASE_S), keepalive=False)
        if lease is None:
            raise ControlFailed("the job's lease was refused")
        _log_grant(writer, _JOB, lease)
        kill_at = time.monotonic() + LEASE_S + LEASE_S  # the lease, then a "grace" as long
        env = {**os.environ, "FLEETCRON_JOB": _JOB, "FLEETCRON_FENCE": str(lease.fence)}
        child = subprocess.Popen(_job_command(), env=env, start_new_session=True)
        try:
            child.wait(max(0.0, kill_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        writer.log("release_invoke", _JOB, fence=lease.fence)
        released = lease.release()
        writer.log("release_ok" if released else "release_lost", _JOB, fence=lease.fence)
        writer.log("stopped", _JOB, fence=lease.fence)


def late_kill_control(workdir: Path, *, broken: bool) -> list[Event]:
    """Control (c): a replica runs a job whose work (:data:`WORK_S`) outlasts its lease
    (:data:`LEASE_S`, no keepalive). ``broken``: the scheduler that kills late; else
    ``fleetcron exec``'s supervision. SQLite in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    url = f"sqlite:///{workdir / f'store-{tag}.db'}"
    history = workdir / f"history-{tag}-replica.jsonl"
    job_history = workdir / f"history-{tag}-job.jsonl"
    args = (broken, url, f"fault-control-{tag}", str(history), str(job_history))
    _run([(_scheduler_worker, args)], ["replica-1"])
    return read_history([history, job_history])
