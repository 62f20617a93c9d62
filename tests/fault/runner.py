"""Running one scenario on one backend: its store, its processes, its faults, its verdict.

A :class:`Run` is what a scenario's body works with: the backend's URL (direct, or through
a :class:`~fault.proxy.FaultProxy`), the store server when the scenario owns one, helpers
that start lock contenders and ``fleetcron run`` replicas as real processes, and a record
of every fault injected. When the body returns, every process is stopped, the histories
and the ledger are read and :func:`fault.checker.check` gives the verdict.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fault.checker import Report, check
from fault.history import Event, read_history
from fault.protected import ProtectedResource
from fault.runs import ClockSample, runs_alive_after_lease
from fleetcron.models import RunRecord
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.base import SyncStore
from fleetcron.stores.sql.files import load_queries
from services import SERVICE_URLS, STORES

__all__ = [
    "BACKENDS",
    "Proc",
    "Run",
    "RunResult",
    "Scenario",
    "run_scenario",
    "wait_until",
]

BACKENDS = (*STORES, "etcd")
"""Every backend a scenario may run on: the services', and etcd on three members of the
run's own (:class:`~fault.etcd_members.EtcdMembers`) whatever the scenario's ``needs``."""
ROOT = Path(__file__).resolve().parents[2]
_TESTS = ROOT / "tests"


# SQLite and Redis answer in milliseconds: every store-clock comparison gives the holder
# that much.
_TOLERANCE_US = 1_000


class ScenarioFailed(AssertionError):
    """A scenario's own expectation (beyond the checker's rules) did not hold."""


def wait_until(
    condition: Callable[[], Any], *, timeout: float = 30.0, what: str = "a condition"
) -> Any:
    """Poll ``condition`` until it returns something truthy; raise after ``timeout`` s."""
    give_up = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > give_up:
            raise ScenarioFailed(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: the suite and the package importable."""
    env = dict(os.environ)
    paths = [str(_TESTS), str(ROOT / "src"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("FLEETCRON_BACKEND", None)
    env.update(extra or {})
    return env


@dataclass
class Proc:
    """A worker process of the run."""

    role: str
    worker: str
    popen: subprocess.Popen[str]
    stderr: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (not to its children)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signum)

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault injected: what, and when (CLOCK_MONOTONIC µs)."""

    mono_us: int
    what: str


@dataclass
class Run:
    """The state of one scenario on one backend (see the module docstring)."""

    scenario: str
    backend: str
    url: str
    tmp: Path
    namespace: str = field(default_factory=lambda: f"fault-{uuid.uuid4().hex[:12]}")
    server: Any = None
    store_clock: Any = None
    """The owned server's :class:`~fault.clock.SteppableClock` (``Scenario.store_clock``)."""
    procs: list[Proc] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    ledger_jobs: set[str] = field(default_factory=set)
    expected_slots: dict[str, list[int]] = field(default_factory=dict)
    allow: set[str] = field(default_factory=set)
    proxies: list[Any] = field(default_factory=list)
    samples: list[ClockSample] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    """What a scenario measured beside the checker's verdict (e.g. the acknowledged writes
    a failover lost), reported with its result."""

    @property
    def protected(self) -> Path:
        """The file of the fence-checking resource every worker writes to."""
        return self.tmp / "protected.db"

    @contextlib.contextmanager
    def sampling(self, every_s: float = 0.1) -> Iterator[None]:
        """Read the store's clock every ``every_s`` in the background (for judging runs on
        the store's clock); a failed read (store down) is simply not a sample."""
        stop = threading.Event()

        def sample() -> None:
            store: SyncStore | None = None
            while not stop.is_set():
                try:
                    if store is None:
                        store = open_store(parse_store_url(self.url))
                    invoke = time.monotonic_ns() // 1000
                    now = store.run(store.ops.store_now())
                    heard = time.monotonic_ns() // 1000
                    self.samples.append(ClockSample(invoke, now, heard))
                except Exception:  # the store may be down: that is part of the scenario
                    if store is not None:
                        with contextlib.suppress(Exception):
                            store.close()
                    store = None
                stop.wait(every_s)
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()

        thread = threading.Thread(target=sample, name="store-clock", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(30)

    def wait_store_time(self, micros: int, what: str = "") -> None:
        """Wait until the store's clock has moved on by ``micros`` from now."""
        target = self.store_now() + micros
        wait_until(
            lambda: self.store_now() >= target,
            what=what or f"{micros / 1e6:g} s of store time",
        )

    def fault(self, what: str) -> None:
        """Record a fault injected now."""
        self.faults.append(Fault(time.monotonic_ns() // 1000, what))

    # -- the store as this process sees it ---------------------------------------------
    @contextlib.contextmanager
    def store(self, url: str | None = None) -> Iterator[SyncStore]:
        """A connection of the runner itself (direct, not through a proxy)."""
        opened = open_store(parse_store_url(url or self.url))
        try:
            yield opened
        finally:
            opened.close()

    def ledger(self, job: str) -> list[RunRecord]:
        with self.store() as store:
            return store.run(store.ops.run_list(self.namespace, job, 10_000))

    def store_now(self) -> int:
        if parse_store_url(self.url).kind == "sqlite":
            # SQLite's clock is the host's, read by an expression that touches no table:
            # evaluated apart from the database file, it never queues behind the write lock
            # of a process the scenario froze inside a transaction (which it would wait for
            # while that process waits for this clock to let it go on).
            with contextlib.closing(sqlite3.connect(":memory:")) as conn:
                (now,) = conn.execute(load_queries("sqlite")["store_now"]).fetchone()
            return int(now)
        with self.store() as store:
            return store.run(store.ops.store_now())

    # -- proxies -----------------------------------------------------------------------
    def proxied(self) -> tuple[str, Any]:
        """A new :class:`~fault.proxy.FaultProxy` in front of the store, and the URL that
        goes through it."""
        from fault.proxy import FaultProxy

        if self.backend == "etcd":
            from fault.etcd_members import proxied_etcd_url

            url, group = proxied_etcd_url(self.url)
            self.proxies.append(group)
            return url, group
        parts = urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port
        if port is None:
            raise ScenarioFailed(f"{self.backend} has no TCP port to put a proxy in front of")
        proxy = FaultProxy((host, port))
        self.proxies.append(proxy)
        netloc = parts.netloc.rsplit(":", 1)[0] + f":{proxy.port}"
        return urlunsplit(parts._replace(netloc=netloc)), proxy

    # -- processes ---------------------------------------------------------------------
    def lockers(
        self,
        count: int,
        *,
        name: str = "res",
        url: str | None = None,
        ttl_ms: int = 2000,
        hold_ms: int = 20,
        writes: int = 2,
        duration_s: float = 3.0,
        keepalive: bool = False,
        extend: bool = False,
        env: Mapping[str, str] | None = None,
        prefix: str = "L",
        start: bool = True,
    ) -> list[Proc]:
        """Start ``count`` lock contenders; with ``start``, release them together."""
        ProtectedResource(self.protected)  # created before anyone races to create it
        procs = []
        for index in range(count):
            worker = f"{prefix}{len(self.procs) + index}"
            history = self.tmp / f"history-{worker}.jsonl"
            command = [
                sys.executable,
                "-m",
                "fault.workers",
                "locker",
                f"--url={url or self.url}",
                f"--namespace={self.namespace}",
                f"--name={name}",
                f"--worker={worker}",
                f"--history={history}",
                f"--protected={self.protected}",
                f"--ttl-ms={ttl_ms}",
                f"--hold-ms={hold_ms}",
                f"--writes={writes}",
                f"--duration-s={duration_s}",
                *(["--keepalive"] if keepalive else []),
                *(["--extend"] if extend else []),
            ]
            stderr = self.tmp / f"stderr-{worker}.txt"
            with stderr.open("w") as errors:
                popen = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    text=True,
                    cwd=ROOT,
                    env=child_env(env),
                )
            procs.append(Proc("locker", worker, popen, stderr))
        self.procs += procs
        for proc in procs:
            assert proc.popen.stdout is not None
            line = proc.popen.stdout.readline()
            if line.strip() != "ready":
                said = proc.stderr.read_text()[-2000:]
                raise ScenarioFailed(f"{proc.worker} did not start: {said}")
        if start:
            self.go(procs)
        return procs

    def go(self, procs: Sequence[Proc]) -> None:
        """Release contenders waiting for the start line."""
        for proc in procs:
            assert proc.popen.stdin is not None
            proc.popen.stdin.write("go\n")
            proc.popen.stdin.flush()

    def job_body(self, job: str, work_s: float) -> list[str]:
        """The argv of a command job whose body is :func:`fault.workers.jobbody`, logging
        to ``job``'s run history; the job's ledger is checked at the end."""
        ProtectedResource(self.protected)  # created before the runs race to create it
        self.ledger_jobs.add(job)
        history = self.tmp / f"history-runs-{job}.jsonl"
        return [
            sys.executable,
            "-m",
            "fault.workers",
            "jobbody",
            str(history),
            str(self.protected),
            str(work_s),
        ]

    def jobs_file(
        self,
        job: str | Sequence[str] = "tick",
        *,
        every: str = "1s",
        work_s: float = 0.1,
        lock_at_most: str = "2s",
        extra: str = "",
        path: Path | None = None,
    ) -> Path:
        """A jobs file with a command job (or one per name of ``job``) whose body is
        :func:`fault.workers.jobbody`."""
        path = path or self.tmp / "jobs.toml"
        names = [job] if isinstance(job, str) else list(job)
        path.write_text(
            "".join(
                f"[jobs.{name}]\n"
                f'every = "{every}"\n'
                f"command = {json.dumps(self.job_body(name, work_s))}\n"
                f'lock_at_most = "{lock_at_most}"\n'
                f"{extra}"
                for name in names
            )
        )
        return path

    def replicas(
        self,
        count: int,
        jobs: Path,
        *,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        prefix: str = "R",
    ) -> list[Proc]:
        """Start ``count`` ``fleetcron run`` replicas of ``jobs``; wait until each is up."""
        procs = []
        for index in range(count):
            worker = f"{prefix}{len(self.procs) + index}"
            command = [
                sys.executable,
                "-c",
                "from fleetcron.cli.main import entry; entry()",
                "run",
                str(jobs),
                "--backend",
                url or self.url,
                "--namespace",
                self.namespace,
                *args,
            ]
            stderr = self.tmp / f"stderr-{worker}.txt"
            with stderr.open("w") as errors:
                popen = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    text=True,
                    cwd=ROOT,
                    env=child_env({**(env or {}), "FAULT_REPLICA": worker}),
                    start_new_session=True,
                )
            procs.append(Proc("replica", worker, popen, stderr))
        self.procs += procs
        return procs

    def wait_runs(self, job: str, count: int, *, timeout: float = 60.0) -> list[RunRecord]:
        """Wait until the ledger of ``job`` holds ``count`` finished runs."""
        finished = {"succeeded", "failed", "lost", "skipped", "missed", "cancelled"}

        def enough() -> list[RunRecord] | None:
            rows = [row for row in self.ledger(job) if row.state in finished]
            return rows if len(rows) >= count else None

        result: list[RunRecord] = wait_until(
            enough, timeout=timeout, what=f"{count} finished runs of {job}"
        )
        return result

    def wait_exit(self, procs: Sequence[Proc], *, timeout: float = 60.0) -> None:
        """Wait for ``procs`` to end by themselves."""
        give_up = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.popen.wait(max(0.1, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise ScenarioFailed(f"{proc.worker} did not end in {timeout}s") from None

    def stop_all(self, *, grace_s: float = 30.0) -> None:
        """SIGCONT then SIGTERM every process still alive; SIGKILL what outlives the grace."""
        for proc in self.procs:
            if proc.alive():
                proc.signal(signal.SIGCONT)
                proc.signal(signal.SIGTERM)
        give_up = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.popen.wait(max(0.1, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.signal(signal.SIGKILL)
                proc.popen.wait(10)
        for proc in self.procs:
            for stream in (proc.popen.stdin, proc.popen.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    def histories(self) -> list[Event]:
        return read_history(sorted(self.tmp.glob("history-*.jsonl")))


@dataclass(frozen=True)
class Scenario:
    """A named fault scenario: ``body(run)`` drives processes and faults; the checker
    judges the histories afterwards. ``needs`` says what the body needs from the store:
    ``"shared"`` (the machine's service, a fresh namespace), ``"owned"`` (a server of
    its own, which the body may restart or pause), ``"pair"`` (PostgreSQL only: a
    :class:`~fault.pg_pair.PostgresPair` of its own, primary and streaming standby, which
    the body may fail over; ``run.url`` names both), ``"cluster"`` (Redis only: a
    :class:`~redis_cluster.RedisCluster` of its own, three masters and three replicas).
    On etcd every scenario has three members of its own
    (:class:`~fault.etcd_members.EtcdMembers`), each in a network namespace of its own
    with ``"partition"``."""

    name: str
    summary: str
    body: Callable[[Run], None]
    backends: tuple[str, ...] = BACKENDS
    needs: str = "shared"
    fast: bool = False
    fast_backends: tuple[str, ...] | None = None
    """Where the fast subset runs it (``fast`` only): ``None``, on each of its backends but
    etcd (three members of their own cost seconds a case)."""
    allow: frozenset[str] = frozenset()
    server_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per backend: the keyword arguments of its owned server."""
    ok_states: frozenset[str] = frozenset({"succeeded"})
    store_clock: bool = False
    """Run the owned server under a :class:`~fault.clock.SteppableClock` (``run.store_clock``)."""

    def fast_on(self, backend: str) -> bool:
        """Whether the fast subset runs this scenario on ``backend``."""
        if not self.fast or backend not in self.backends:
            return False
        return backend in self.fast_backends if self.fast_backends else backend != "etcd"


@dataclass
class RunResult:
    """What one scenario on one backend found."""

    scenario: str
    backend: str
    report: Report | None
    faults: int
    seconds: float
    error: str | None = None
    events: int = 0
    slots: int = 0
    figures: dict[str, Any] = field(default_factory=dict)
    """The scenario's own figures (:attr:`Run.figures`)."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.report is not None and self.report.ok

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "backend": self.backend,
            "ok": self.ok,
            "faults": self.faults,
            "events": self.events,
            "slots": self.slots,
            "seconds": round(self.seconds, 1),
            "anomalies": [str(a) for a in self.report.anomalies] if self.report else [],
            "allowed": dict(self.allowed()),
            "operations": self.report.operations if self.report else 0,
            "grants": self.report.grants if self.report else 0,
            "writes": self.report.writes if self.report else 0,
            "rejected": self.report.rejected if self.report else 0,
            "signs": self.report.signs if self.report else 0,
            "error": self.error,
            "figures": self.figures,
        }

    def allowed(self) -> Counter[str]:
        """The allowed anomalies found, by kind (the scenario's faults showing through)."""
        if self.report is None:
            return Counter()
        return Counter(anomaly.kind for anomaly in self.report.allowed)


def _store_for(
    scenario: Scenario, backend: str, tmp: Path, stack: contextlib.ExitStack
) -> tuple[str, Any, Any]:
    """The store's URL, its owned server (or ``None``) and the server's steppable clock
    (or ``None``)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp / 'store.db'}", None, None
    if backend == "etcd":
        from fault.etcd_members import EtcdMembers

        members = EtcdMembers(partitionable=scenario.needs == "partition")
        stack.callback(members.close)
        return members.url, members, None
    if scenario.needs == "shared":
        return SERVICE_URLS[backend], None, None
    from fault import servers
    from fault.clock import SteppableClock

    options = dict(scenario.server_options.get(backend, {}))
    if scenario.needs == "pair":
        from fault.pg_pair import PostgresPair

        pair = PostgresPair(tmp / "pg", **options)
        stack.callback(pair.close)
        return pair.url, pair, None
    if scenario.needs == "cluster":
        from redis_cluster import RedisCluster

        cluster = RedisCluster(**options)
        stack.callback(cluster.close)
        return cluster.url, cluster, None
    clock = None
    if scenario.store_clock:
        clock = SteppableClock(0)
        stack.callback(clock.close)
        options["env"] = {**options.get("env", {}), **clock.env}
    server: Any
    if backend == "postgres":
        server = servers.PostgresCluster(tmp / "pg", **options)
    elif backend == "mysql":
        server = servers.MariaDbInstance(tmp / "mariadb", **options)
    else:
        server = servers.RedisInstance(tmp / "redis", **options)
    stack.callback(server.close)
    return str(server.url), server, clock


def run_scenario(scenario: Scenario, backend: str, *, keep: Path | None = None) -> RunResult:
    """Run ``scenario`` on ``backend`` and check what happened. ``keep``: a directory
    to copy the histories to (else they go with the temporary directory)."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fault-")))
        url, server, clock = _store_for(scenario, backend, tmp, stack)
        run = Run(
            scenario=scenario.name,
            backend=backend,
            url=url,
            tmp=tmp,
            server=server,
            store_clock=clock,
        )
        run.allow |= scenario.allow
        error = None
        try:
            with run.store() as store:
                store.migrate()
            with run.sampling():
                scenario.body(run)
        except ScenarioFailed as exc:
            error = str(exc)
        finally:
            run.stop_all()
            for proxy in run.proxies:
                proxy.close()
            for cleanup in reversed(run.cleanups):
                cleanup()
        events = run.histories()
        ledger = [row for job in sorted(run.ledger_jobs) for row in run.ledger(job)]
        report = check(
            events,
            ledger=ledger or None,
            slots=run.expected_slots or None,
            allow=frozenset(run.allow),
            ok_states=scenario.ok_states,
            tolerance_us=_TOLERANCE_US,
        )
        late, judged = runs_alive_after_lease(events, ledger, run.samples)
        report.anomalies += late
        report.signs += judged
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for path in tmp.glob("*.jsonl"):
                (keep / path.name).write_text(path.read_text())
            for path in tmp.glob("stderr-*.txt"):
                (keep / path.name).write_text(path.read_text())
        return RunResult(
            scenario=scenario.name,
            backend=backend,
            report=report,
            faults=len(run.faults),
            seconds=time.monotonic() - started,
            error=error,
            events=len(events),
            slots=len(ledger),
            figures=run.figures,
        )
