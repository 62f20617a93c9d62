"""Work-queue throughput: put, and claim + ack, in items/s at batch sizes 1, 10 and 100 —
fleetcron's queue on every backend beside procrastinate and pgqueuer on the same PostgreSQL.

Run from the project root::

    .venv/bin/pip install -e '.[bench]'          # procrastinate, pgqueuer (+ asyncpg)
    .venv/bin/python bench/work_queue.py              # full run: 5 rounds, about 11 minutes here
    .venv/bin/python bench/work_queue.py --smoke      # quick check of every subject (< 1 minute)
    .venv/bin/python bench/work_queue.py --only postgres,procrastinate,pgqueuer --rounds 3

Subjects (one client, sequential, one connection each):

- ``fleetcron-<backend>``: ``Fleet(url, namespace=…).queue(name)`` (sync), and
  ``fleetcron-<backend>-async``: ``await AsyncFleet.connect(url, namespace=…)`` then
  ``.queue(name)``, on SQLite, PostgreSQL (psycopg 3), MariaDB (PyMySQL / aiomysql) and
  Redis (redis-py). put = ``put(value)`` at batch 1, ``put_many(values)`` above;
  claim + ack = ``claim(batch)`` then ``ack(*items)``.
- ``procrastinate`` (3.x, ``PsycopgConnector``: psycopg 3 async, a pool of one
  connection, in its own database ``bench_procrastinate``): put = ``task.defer_async`` at
  batch 1, ``task.batch_defer_async`` above; claim + ack = what its worker does per job,
  driven directly: ``JobManager.fetch_job`` (one job per query, whatever the batch) then
  ``JobManager.finish_job(job, succeeded, delete_job=False)`` (the worker's default).
- ``pgqueuer`` (1.x, ``Queries`` over its psycopg 3 async driver, in its own database
  ``bench_pgqueuer``): put = ``Queries.enqueue`` (scalars at batch 1, lists above);
  claim + ack = what its ``QueueManager`` does: ``Queries.dequeue(batch_size=…)`` then
  ``Queries.log_jobs`` of the batch as ``successful`` (the manager's status buffer flushes
  at ``batch_size`` items).
- ``pgqueuer-asyncpg``: the same over asyncpg, pgqueuer's first driver; an extra, for
  context (the comparison uses psycopg 3 on every side).

Method: every subject is built once and warmed (one small untimed put + drain per batch
size). Each round visits every (subject, batch size) cell in a freshly shuffled order; a
cell makes a fresh queue (fleetcron: a new queue name in the run's fresh namespace;
procrastinate: a new queue name; pgqueuer: a new entrypoint), puts ``--items`` items
(``--items1`` at batch 1) in calls of ``batch`` items, timed, then drains them with
claim(batch) + ack until all are acknowledged, timed, checks that nothing is left, and
deletes the finished items through each library's own retention call (fleetcron
``prune(older_than=0)``, procrastinate ``delete_old_jobs(0, queue=…)``, pgqueuer
``clear_queue_log``/``clear_statistics_log``), untimed; then, untimed too, it runs
``VACUUM (ANALYZE)`` on the tables of that PostgreSQL subject (fleetcron_queue_item;
procrastinate_jobs and _events; pgqueuer, pgqueuer_log and _statistics): the server here
runs with ``autovacuum = off``, and without it every queue table piles up dead index
entries that the next claims walk past, so the peers' claim rates fell round after round
(``--no-vacuum`` shows it). GC is off inside the timed phases. Reported per (subject,
batch, op): the median over rounds of items/s, its range, and client CPU (process time,
all threads) per item. Ratios are fleetcron ÷ peer on items/s (above 1: fleetcron is
faster), from the medians and paired by round. Round trips per item are counted in a
separate, untimed pass through the counting TCP relay of ``bench/locks.py``. Every subject
talks to 127.0.0.1 only.

Results: a markdown table on stdout and ``bench/results/queue.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
PORTS = {"postgres": 5432, "mysql": 3306, "redis": 6379}
PG_USER, PG_DB = "postgres", "test"
MYSQL_USER, MYSQL_DB = "root", "test"
REDIS_DB = 0
PROCRASTINATE_DB = "bench_procrastinate"
PGQUEUER_DB = "bench_pgqueuer"
# What each PostgreSQL subject's cell leaves dead rows in: vacuumed after every cell (see
# the module docstring), as a server whose autovacuum keeps up would.
VACUUM_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "fleetcron-postgres": (PG_DB, ("fleetcron_queue_item",)),
    "fleetcron-postgres-async": (PG_DB, ("fleetcron_queue_item",)),
    "procrastinate": (PROCRASTINATE_DB, ("procrastinate_jobs", "procrastinate_events")),
    "pgqueuer": (PGQUEUER_DB, ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")),
    "pgqueuer-asyncpg": (PGQUEUER_DB, ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")),
}
BACKENDS = ("sqlite", "postgres", "mysql", "redis")
BATCHES = (1, 10, 100)
OPS = ("put", "claim_ack")
OP_LABEL = {"put": "put", "claim_ack": "claim + ack"}
FLEETCRON_PG = ("fleetcron-postgres-async", "fleetcron-postgres")
PEERS = ("procrastinate", "pgqueuer", "pgqueuer-asyncpg")
TARGET_PEERS = ("procrastinate", "pgqueuer")
RESULTS = HERE / "results" / "queue.json"
PACKAGES = (
    "fleetcron",
    "procrastinate",
    "pgqueuer",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "asyncpg",
    "PyMySQL",
    "aiomysql",
    "redis",
    "hiredis",
)


class BenchError(RuntimeError):
    """A put or a drain did not do what it must (every item put once, delivered once)."""


def _check(ok: object, what: str) -> None:
    if not ok:
        raise BenchError(what)


def _load_locks() -> ModuleType:
    """``bench/locks.py``, for its counting relay and server probes."""
    spec = importlib.util.spec_from_file_location("fleetcron_bench_locks", HERE / "locks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


# -- runners -----------------------------------------------------------------------------
#
# A runner is one client of one subject. ``begin(tag)`` switches it to a fresh queue,
# ``put(values)`` puts them in one call (the library's single-item call for one value),
# ``claim_ack(batch)`` claims up to ``batch`` items and acknowledges them, answering how
# many, ``cleanup()`` deletes the queue's finished items. A sync runner's methods are plain
# functions; an async runner's are coroutine functions, run on one event loop.


def payloads(n: int) -> list[dict[str, Any]]:
    return [{"n": i, "kind": "bench"} for i in range(n)]


class FleetcronSync:
    def __init__(self, url: str, namespace: str) -> None:
        from fleetcron import Fleet

        self.fleet = Fleet(url, namespace=namespace)
        self.queue: Any = None

    def begin(self, tag: str) -> None:
        self.queue = self.fleet.queue(tag)

    def put(self, values: list[Any]) -> None:
        if len(values) == 1:
            _check(self.queue.put(values[0]) is not None, "fleetcron put answered None")
            return
        ids = self.queue.put_many(values)
        _check(len(ids) == len(values) and None not in ids, "fleetcron put_many lost items")

    def claim_ack(self, batch: int) -> int:
        items = self.queue.claim(batch)
        if not items:
            return 0
        _check(all(self.queue.ack(*items)), "fleetcron ack refused a claim")
        return len(items)

    def cleanup(self) -> None:
        while self.queue.prune(older_than=0):
            pass

    def close(self) -> None:
        self.fleet.close()


class FleetcronAsync:
    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.queue: Any = None

    @classmethod
    async def open(cls, url: str, namespace: str) -> FleetcronAsync:
        from fleetcron import AsyncFleet

        return cls(await AsyncFleet.connect(url, namespace=namespace))

    async def begin(self, tag: str) -> None:
        self.queue = self.fleet.queue(tag)

    async def put(self, values: list[Any]) -> None:
        if len(values) == 1:
            _check(await self.queue.put(values[0]) is not None, "fleetcron put answered None")
            return
        ids = await self.queue.put_many(values)
        _check(len(ids) == len(values) and None not in ids, "fleetcron put_many lost items")

    async def claim_ack(self, batch: int) -> int:
        items = await self.queue.claim(batch)
        if not items:
            return 0
        _check(all(await self.queue.ack(*items)), "fleetcron ack refused a claim")
        return len(items)

    async def cleanup(self) -> None:
        while await self.queue.prune(older_than=0):
            pass

    async def close(self) -> None:
        await self.fleet.close()


def pg_conninfo(port: int, dbname: str) -> str:
    return f"host={HOST} port={port} user={PG_USER} dbname={dbname}"


class Procrastinate:
    """procrastinate 3.x: ``defer_async``/``batch_defer_async``; the worker's
    ``fetch_job`` + ``finish_job`` (one job per fetch)."""

    def __init__(self, app: Any, task: Any, worker_id: int) -> None:
        from procrastinate.jobs import Status

        self.app = app
        self.task = task
        self.worker_id = worker_id
        self.succeeded = Status.SUCCEEDED
        self.tag = ""

    @classmethod
    async def open(cls, port: int) -> Procrastinate:
        import procrastinate

        connector = procrastinate.PsycopgConnector(
            conninfo=pg_conninfo(port, PROCRASTINATE_DB), min_size=1, max_size=1
        )
        app = procrastinate.App(connector=connector)

        @app.task(name="bench_noop")
        async def bench_noop(n: int, kind: str) -> None:
            """The task the jobs name (never run: the benchmark drains the jobs itself)."""

        await app.open_async()
        worker_id = await app.job_manager.register_worker()
        return cls(app, bench_noop, worker_id)

    async def begin(self, tag: str) -> None:
        self.tag = tag

    async def put(self, values: list[Any]) -> None:
        deferrer = self.task.configure(queue=self.tag)
        if len(values) == 1:
            _check(await deferrer.defer_async(**values[0]), "procrastinate defer gave no id")
            return
        ids = await deferrer.batch_defer_async(*values)
        _check(len(ids) == len(values), "procrastinate batch_defer lost jobs")

    async def claim_ack(self, batch: int) -> int:
        manager = self.app.job_manager
        jobs = []
        for _ in range(batch):  # the worker fetches one job per query
            job = await manager.fetch_job(queues=[self.tag], worker_id=self.worker_id)
            if job is None:
                break
            jobs.append(job)
        for job in jobs:  # finish_job raises unless the job was doing
            await manager.finish_job(job=job, status=self.succeeded, delete_job=False)
        return len(jobs)

    async def cleanup(self) -> None:
        await self.app.job_manager.delete_old_jobs(nb_hours=0, queue=self.tag)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.app.job_manager.unregister_worker(self.worker_id)
        await self.app.close_async()


class PgQueuer:
    """pgqueuer 1.x: ``Queries.enqueue``; ``Queries.dequeue(batch_size)`` + ``log_jobs``."""

    def __init__(self, queries: Any, conn: Any) -> None:
        from pgqueuer.queries import EntrypointExecutionParameter

        self.queries = queries
        self.conn = conn
        self.param = EntrypointExecutionParameter(concurrency_limit=0)
        self.manager_id = uuid.uuid4()
        self.heartbeat_timeout = timedelta(seconds=30)  # QueueManager.run's default
        self.tag = ""
        self.entrypoints: dict[str, Any] = {}

    @classmethod
    async def open(cls, port: int) -> PgQueuer:
        import psycopg
        from pgqueuer.queries import Queries

        conn = await psycopg.AsyncConnection.connect(
            pg_conninfo(port, PGQUEUER_DB), autocommit=True
        )
        return cls(Queries.from_psycopg_connection(conn), conn)

    @classmethod
    async def open_asyncpg(cls, port: int) -> PgQueuer:
        import asyncpg  # type: ignore[import-untyped]
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(
            host=HOST, port=port, user=PG_USER, database=PGQUEUER_DB, ssl=False
        )
        return cls(Queries.from_asyncpg_connection(conn), conn)

    async def begin(self, tag: str) -> None:
        self.tag = tag
        self.entrypoints = {tag: self.param}

    async def put(self, values: list[Any]) -> None:
        encoded = [json.dumps(value).encode() for value in values]
        if len(values) == 1:
            ids = await self.queries.enqueue(self.tag, encoded[0], 0)
        else:
            n = len(values)
            ids = await self.queries.enqueue([self.tag] * n, encoded, [0] * n)
        _check(len(ids) == len(values), "pgqueuer enqueue lost jobs")

    async def claim_ack(self, batch: int) -> int:
        jobs = await self.queries.dequeue(
            batch_size=batch,
            entrypoints=self.entrypoints,
            queue_manager_id=self.manager_id,
            global_concurrency_limit=None,
            heartbeat_timeout=self.heartbeat_timeout,
        )
        if not jobs:
            return 0
        await self.queries.log_jobs([(job, "successful", None) for job in jobs])
        return len(jobs)

    async def cleanup(self) -> None:
        await self.queries.clear_queue_log(self.tag)
        await self.queries.clear_statistics_log(self.tag)

    async def close(self) -> None:
        await self.conn.close()


# -- subjects ----------------------------------------------------------------------------


@dataclass
class Subject:
    key: str
    backend: str
    kind: str  # fleetcron | peer
    mode: str  # sync | async
    label: str
    build: Callable[[int], Any]  # port -> runner (async subjects: an awaitable of one)
    status: str = "pending"
    reason: str = ""
    # (batch, op) -> round -> (items/s, client CPU µs per item)
    rounds: dict[tuple[int, str], dict[int, tuple[float, float]]] = field(default_factory=dict)
    rt: dict[tuple[int, str], dict[str, float]] = field(default_factory=dict)


def fleetcron_url(backend: str, port: int, tmp: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp / 'fleetcron-queue.db'}"
    if backend == "postgres":
        return f"postgresql://{PG_USER}@{HOST}:{port}/{PG_DB}"
    if backend == "mysql":
        return f"mysql://{MYSQL_USER}@{HOST}:{port}/{MYSQL_DB}"
    return f"redis://{HOST}:{port}/{REDIS_DB}"


def make_subjects(tmp: Path, namespace: str) -> list[Subject]:
    subjects: list[Subject] = []
    names = {"sqlite": "sqlite", "postgres": "postgresql", "mysql": "mysql/mariadb",
             "redis": "redis"}  # fmt: skip
    drivers = {
        "sqlite": ("sqlite3, synchronous=FULL", "sqlite3 in a thread"),
        "postgres": ("psycopg 3", "psycopg 3 async"),
        "mysql": ("PyMySQL", "aiomysql"),
        "redis": ("redis-py", "redis.asyncio"),
    }
    for backend in BACKENDS:
        sync_driver, async_driver = drivers[backend]

        def sync_build(port: int, backend: str = backend) -> FleetcronSync:
            return FleetcronSync(fleetcron_url(backend, port, tmp), namespace)

        def async_build(port: int, backend: str = backend) -> Awaitable[FleetcronAsync]:
            return FleetcronAsync.open(fleetcron_url(backend, port, tmp), namespace)

        subjects += [
            Subject(f"fleetcron-{backend}", backend, "fleetcron", "sync",
                    f"fleetcron {names[backend]} (Fleet, {sync_driver})", sync_build),
            Subject(f"fleetcron-{backend}-async", backend, "fleetcron", "async",
                    f"fleetcron {names[backend]} (AsyncFleet, {async_driver})", async_build),
        ]  # fmt: skip
    subjects += [
        Subject("procrastinate", "postgres", "peer", "async",
                "procrastinate (PsycopgConnector: psycopg 3 async, pool of 1)",
                Procrastinate.open),
        Subject("pgqueuer", "postgres", "peer", "async",
                "pgqueuer (Queries, psycopg 3 async driver)", PgQueuer.open),
        Subject("pgqueuer-asyncpg", "postgres", "peer", "async",
                "pgqueuer (Queries, asyncpg driver; extra, for context)",
                PgQueuer.open_asyncpg),
    ]  # fmt: skip
    return subjects


# -- one-time setup of the peers' databases ----------------------------------------------


def ensure_database(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(pg_conninfo(PORTS["postgres"], PG_DB), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


async def install_procrastinate() -> None:
    import procrastinate

    ensure_database(PROCRASTINATE_DB)
    connector = procrastinate.PsycopgConnector(
        conninfo=pg_conninfo(PORTS["postgres"], PROCRASTINATE_DB), min_size=1, max_size=1
    )
    app = procrastinate.App(connector=connector)
    async with app.open_async():
        row = await connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS installed"
        )
        if not row["installed"]:
            await app.schema_manager.apply_schema_async()


async def install_pgqueuer() -> None:
    import psycopg
    from pgqueuer.queries import Queries

    ensure_database(PGQUEUER_DB)
    conn = await psycopg.AsyncConnection.connect(
        pg_conninfo(PORTS["postgres"], PGQUEUER_DB), autocommit=True
    )
    try:
        queries = Queries.from_psycopg_connection(conn)
        if not await queries.schema_is_installed():
            await queries.install()
    finally:
        await conn.close()


INSTALL: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
    "procrastinate": install_procrastinate,
    "pgqueuer": install_pgqueuer,
    "pgqueuer-asyncpg": install_pgqueuer,
}


# -- timing ------------------------------------------------------------------------------


@dataclass
class Phase:
    seconds: float
    cpu_s: float
    items: int

    @property
    def items_s(self) -> float:
        return self.items / self.seconds

    @property
    def cpu_us_per_item(self) -> float:
        return self.cpu_s * 1e6 / self.items


def groups_of(values: list[Any], batch: int) -> list[list[Any]]:
    return [values[i : i + batch] for i in range(0, len(values), batch)]


def _drained(drained: int, n: int) -> None:
    _check(drained == n, f"drained {drained} items of {n} put")


def measure_sync(runner: Any, tag: str, batch: int, n: int) -> tuple[Phase, Phase]:
    groups = groups_of(payloads(n), batch)
    runner.begin(tag)
    put, claim_ack = runner.put, runner.claim_ack
    clock, cpu = time.perf_counter, time.process_time
    gc.collect()
    gc.disable()
    try:
        c0, t0 = cpu(), clock()
        for group in groups:
            put(group)
        t1, c1 = clock(), cpu()
        drained = 0
        while drained < n:
            got = claim_ack(batch)
            _check(got, f"the queue ran dry after {drained} of {n} items")
            drained += got
        t2, c2 = clock(), cpu()
    finally:
        gc.enable()
    _drained(drained, n)
    _check(claim_ack(batch) == 0, "items were left after the drain")
    runner.cleanup()
    return Phase(t1 - t0, c1 - c0, n), Phase(t2 - t1, c2 - c1, n)


async def measure_async(runner: Any, tag: str, batch: int, n: int) -> tuple[Phase, Phase]:
    groups = groups_of(payloads(n), batch)
    await runner.begin(tag)
    put, claim_ack = runner.put, runner.claim_ack
    clock, cpu = time.perf_counter, time.process_time
    gc.collect()
    gc.disable()
    try:
        c0, t0 = cpu(), clock()
        for group in groups:
            await put(group)
        t1, c1 = clock(), cpu()
        drained = 0
        while drained < n:
            got = await claim_ack(batch)
            _check(got, f"the queue ran dry after {drained} of {n} items")
            drained += got
        t2, c2 = clock(), cpu()
    finally:
        gc.enable()
    _drained(drained, n)
    _check(await claim_ack(batch) == 0, "items were left after the drain")
    await runner.cleanup()
    return Phase(t1 - t0, c1 - c0, n), Phase(t2 - t1, c2 - c1, n)


class Bench:
    """The subjects' runners and the one event loop the async ones run on."""

    def __init__(self, aio: asyncio.Runner, run_id: str, vacuum: bool) -> None:
        self.aio = aio
        self.run_id = run_id
        self.runners: dict[str, Any] = {}
        self.cells = 0
        self.vacuum = vacuum
        self._vacuum_conns: dict[str, Any] = {}

    def build(self, subject: Subject, port: int) -> Any:
        built = subject.build(port)
        return self.aio.run(built) if subject.mode == "async" else built

    def close(self, subject: Subject, runner: Any) -> None:
        with contextlib.suppress(Exception):
            if subject.mode == "async":
                self.aio.run(runner.close())
            else:
                runner.close()

    def tag(self, subject: Subject, batch: int, what: str) -> str:
        """A fresh queue name (short: procrastinate makes a NOTIFY channel of it, at most
        63 bytes with its 23-byte prefix)."""
        self.cells += 1
        return f"bq{self.run_id}-{batch}-{what}{self.cells}"

    def measure(
        self, subject: Subject, runner: Any, batch: int, n: int, what: str
    ) -> tuple[Phase, Phase]:
        tag = self.tag(subject, batch, what)
        if subject.mode == "async":
            phases = self.aio.run(measure_async(runner, tag, batch, n))
        else:
            phases = measure_sync(runner, tag, batch, n)
        self.vacuum_after(subject)
        return phases

    def vacuum_after(self, subject: Subject) -> None:
        """``VACUUM (ANALYZE)`` the tables the subject's cell left dead rows in (untimed)."""
        if not self.vacuum or subject.key not in VACUUM_TABLES:
            return
        import psycopg
        from psycopg import sql

        dbname, tables = VACUUM_TABLES[subject.key]
        conn = self._vacuum_conns.get(dbname)
        if conn is None:
            conn = psycopg.connect(pg_conninfo(PORTS["postgres"], dbname), autocommit=True)
            self._vacuum_conns[dbname] = conn
        names = sql.SQL(", ").join(sql.Identifier(t) for t in tables)
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(names))

    def close_all(self) -> None:
        for conn in self._vacuum_conns.values():
            with contextlib.suppress(Exception):
                conn.close()


def fail(subject: Subject, bench: Bench, exc: BaseException, when: str) -> None:
    subject.status = "failed"
    cause = exc.__cause__ if not str(exc) and exc.__cause__ is not None else exc
    subject.reason = f"{when}: {type(cause).__name__}: {cause}".splitlines()[0][:300]
    runner = bench.runners.pop(subject.key, None)
    if runner is not None:
        bench.close(subject, runner)
    print(f"  ! {subject.key} not measured ({subject.reason})", file=sys.stderr)


def items_for(batch: int, args: argparse.Namespace) -> int:
    return int(args.items1 if batch == 1 else args.items)


def warm_items(batch: int) -> int:
    return max(30, 3 * batch)


def rt_items(batch: int) -> int:
    return max(50, 5 * batch)


def count_round_trips(
    bench: Bench, subject: Subject, relay_class: Any, batches: list[int]
) -> dict[tuple[int, str], dict[str, float]]:
    """Round trips and bytes per item, through the counting relay (untimed)."""
    if subject.backend == "sqlite":
        zero = {"rt_per_item": 0.0, "conns": 0.0, "up_bytes": 0.0, "down_bytes": 0.0}
        return {(b, op): dict(zero) for b in batches for op in OPS}
    relay = relay_class(PORTS[subject.backend])
    out: dict[tuple[int, str], dict[str, float]] = {}
    runner = bench.build(subject, relay.port)
    try:
        for batch in batches:
            bench.measure(subject, runner, batch, warm_items(batch), "rw")
            n = rt_items(batch)
            tag = bench.tag(subject, batch, "t")
            values = groups_of(payloads(n), batch)
            call = bench.aio.run if subject.mode == "async" else (lambda x: x)
            call(runner.begin(tag))
            time.sleep(0.05)
            relay.reset()
            for group in values:
                call(runner.put(group))
            time.sleep(0.05)
            put_seen = relay.snapshot()
            relay.reset()
            drained = 0
            while drained < n:
                got = call(runner.claim_ack(batch))
                _check(got, "the queue ran dry in the round-trip pass")
                drained += got
            time.sleep(0.05)
            drain_seen = relay.snapshot()
            _drained(drained, n)
            _check(call(runner.claim_ack(batch)) == 0, "items were left after the drain")
            call(runner.cleanup())
            for op, seen in (("put", put_seen), ("claim_ack", drain_seen)):
                out[(batch, op)] = {
                    "rt_per_item": seen["bursts"] / n,
                    "conns": float(seen["connections"]),
                    "up_bytes": seen["up_bytes"] / n,
                    "down_bytes": seen["down_bytes"] / n,
                }
    finally:
        bench.close(subject, runner)
        relay.close()
    return out


def run(args: argparse.Namespace, locks: ModuleType) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-bench-queue-"))
    run_id = secrets.token_hex(3)
    namespace = f"bench-queue-{os.getpid()}-{run_id}"
    subjects = make_subjects(tmp, namespace)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        subjects = [s for s in subjects if any(w in s.key for w in wanted)]
    batches = [int(b) for b in args.batches.split(",")]
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    started = time.time()
    with asyncio.Runner() as aio:
        bench = Bench(aio, run_id, args.vacuum)
        try:
            print(f"setting up {len(subjects)} subjects ...", file=sys.stderr)
            installed: set[Callable[[], Coroutine[Any, Any, None]]] = set()
            for subject in subjects:
                try:
                    install = INSTALL.get(subject.key)
                    if install is not None and install not in installed:
                        aio.run(install())
                        installed.add(install)
                    runner = bench.build(subject, PORTS.get(subject.backend, 0))
                    bench.runners[subject.key] = runner
                    bench.vacuum_after(subject)  # what earlier runs left
                    for batch in batches:
                        bench.measure(subject, runner, batch, warm_items(batch), "w")
                    subject.status = "measured"
                except Exception as exc:
                    fail(subject, bench, exc, "setup/warm-up")

            for round_no in range(args.rounds):
                cells = [(s, b) for s in subjects if s.key in bench.runners for b in batches]
                rng.shuffle(cells)
                for subject, batch in cells:
                    if subject.key not in bench.runners:
                        continue
                    n = items_for(batch, args)
                    try:
                        put, drain = bench.measure(
                            subject, bench.runners[subject.key], batch, n, f"r{round_no}"
                        )
                    except Exception as exc:
                        fail(subject, bench, exc, f"round {round_no}, batch {batch}")
                        continue
                    for op, phase in (("put", put), ("claim_ack", drain)):
                        subject.rounds.setdefault((batch, op), {})[round_no] = (
                            phase.items_s,
                            phase.cpu_us_per_item,
                        )
                print(f"  round {round_no + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for subject in subjects:
                runner = bench.runners.pop(subject.key, None)
                if runner is not None:
                    bench.close(subject, runner)
        timed_s = time.time() - started

        if args.rt:
            print("counting round trips through the relay ...", file=sys.stderr)
            for subject in subjects:
                if subject.status != "measured":
                    continue
                try:
                    subject.rt = count_round_trips(bench, subject, locks.CountingRelay, batches)
                except Exception as exc:
                    print(f"  ! round-trip pass failed for {subject.key}: {exc}", file=sys.stderr)
        bench.close_all()
    shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    return summarise(
        subjects, args, batches, started, timed_s, locks, namespace, (load_before, load_after)
    )


# -- reporting ---------------------------------------------------------------------------


def _cell(subject: Subject, batch: int, op: str) -> dict[str, Any] | None:
    per_round = subject.rounds.get((batch, op))
    if not per_round:
        return None
    rates = [v[0] for v in per_round.values()]
    cpus = [v[1] for v in per_round.values()]
    cell: dict[str, Any] = {
        "rounds": len(rates),
        "items_s": statistics.median(rates),
        "items_s_min": min(rates),
        "items_s_max": max(rates),
        "cpu_us_per_item": statistics.median(cpus),
        "per_round": {str(r): {"items_s": v[0], "cpu_us_per_item": v[1]}
                      for r, v in sorted(per_round.items())},
    }  # fmt: skip
    cell |= subject.rt.get((batch, op), {})
    return cell


def ratios(by_key: dict[str, Subject], batches: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for fc_key in FLEETCRON_PG:
        fc = by_key.get(fc_key)
        for peer_key in PEERS:
            peer = by_key.get(peer_key)
            if fc is None or peer is None:
                continue
            for batch in batches:
                for op in OPS:
                    mine = fc.rounds.get((batch, op), {})
                    theirs = peer.rounds.get((batch, op), {})
                    if not mine or not theirs:
                        continue
                    paired = [mine[r][0] / theirs[r][0] for r in mine if r in theirs]
                    out.append({
                        "fleetcron": fc_key,
                        "peer": peer_key,
                        "batch": batch,
                        "op": op,
                        "ratio": statistics.median(v[0] for v in mine.values())
                        / statistics.median(v[0] for v in theirs.values()),
                        "ratio_paired_median": statistics.median(paired) if paired else None,
                    })  # fmt: skip
    return out


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's target: fleetcron ahead of both peers at batch 100."""
    out: dict[str, Any] = {}
    for fc_key in FLEETCRON_PG:
        for op in OPS:
            found = [
                r for r in rows
                if r["fleetcron"] == fc_key and r["op"] == op and r["batch"] == 100
                and r["peer"] in TARGET_PEERS
            ]  # fmt: skip
            if not found:
                continue
            out[f"{fc_key}/{op}"] = {
                "ratios": {r["peer"]: r["ratio"] for r in found},
                "peers_measured": sorted(r["peer"] for r in found),
                "ahead_of_every_measured_peer": all(r["ratio"] > 1 for r in found),
                "ahead_of_both": len(found) == len(TARGET_PEERS)
                and all(r["ratio"] > 1 for r in found),
            }
    return out


def summarise(
    subjects: list[Subject],
    args: argparse.Namespace,
    batches: list[int],
    started: float,
    timed_s: float,
    locks: ModuleType,
    namespace: str,
    load: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for s in subjects:
        row: dict[str, Any] = {
            "key": s.key,
            "backend": s.backend,
            "kind": s.kind,
            "mode": s.mode,
            "label": s.label,
            "status": s.status,
            "reason": s.reason or None,
            "cells": {},
        }
        for batch in batches:
            for op in OPS:
                cell = _cell(s, batch, op)
                if cell is not None:
                    row["cells"][f"{op}/{batch}"] = cell
        rows.append(row)
    by_key = {s.key: s for s in subjects}
    ratio_rows = ratios(by_key, batches)
    return {
        "meta": meta(args, batches, started, timed_s, locks, namespace, load),
        "subjects": rows,
        "ratios": ratio_rows,
        "targets": targets(ratio_rows),
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pg_setting(name: str) -> str | None:
    with contextlib.suppress(Exception):
        import psycopg

        with psycopg.connect(pg_conninfo(PORTS["postgres"], PG_DB)) as conn:
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            return None if row is None else str(row[0])
    return None


def meta(
    args: argparse.Namespace,
    batches: list[int],
    started: float,
    timed_s: float,
    locks: ModuleType,
    namespace: str,
    load: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> dict[str, Any]:
    return {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "timed_phase_s": round(timed_s, 1),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "batches": batches,
        "items_per_cell": {str(b): items_for(b, args) for b in batches},
        "fleetcron_namespace": namespace,
        "loadavg_before": [round(x, 2) for x in load[0]],
        "loadavg_after": [round(x, 2) for x in load[1]],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": locks._cpu_model(),
        "cpus": os.cpu_count(),
        "packages": {p: _version(p) for p in PACKAGES},
        "servers": locks.server_versions(),
        "postgres_autovacuum": _pg_setting("autovacuum"),
        "vacuum_after_each_cell": args.vacuum,
        "databases": {
            "fleetcron": PG_DB,
            "procrastinate": PROCRASTINATE_DB,
            "pgqueuer": PGQUEUER_DB,
        },
        "method": (
            "per round, every (subject, batch) cell in shuffled order: put N items in calls"
            " of `batch` (timed), drain them with claim(batch)+ack until all are acked"
            " (timed), check nothing is left, delete the finished items (untimed); GC off"
            " inside timed phases; items_s = median over rounds of N / phase seconds;"
            " cpu_us_per_item = process CPU (all threads) per item; ratio = fleetcron"
            " items/s / peer items/s; round trips counted in a separate untimed pass"
            " through a counting TCP relay"
        ),
    }


def _fmt(value: Any, spec: str = ",.0f") -> str:
    return "–" if value is None else format(value, spec)


def markdown(result: dict[str, Any]) -> str:
    batches: list[int] = result["meta"]["batches"]
    lines = [
        "| subject | batch | put items/s | put CPU µs/item | put RT/item "
        "| claim+ack items/s | claim+ack CPU µs/item | claim+ack RT/item "
        "| put range | claim+ack range |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["subjects"]:
        label = f"**{r['label']}**" if r["kind"] == "fleetcron" else r["label"]
        if r["status"] != "measured" and not r["cells"]:
            lines.append(f"| {label} | – | not measured: {r['reason']} | | | | | | | |")
            continue
        for batch in batches:
            put = r["cells"].get(f"put/{batch}")
            ack = r["cells"].get(f"claim_ack/{batch}")
            if put is None or ack is None:
                continue
            rt_put = _fmt(put.get("rt_per_item"), ".2f")
            rt_ack = _fmt(ack.get("rt_per_item"), ".2f")
            if r["backend"] == "sqlite":
                rt_put = rt_ack = "0"
            lines.append(
                f"| {label} | {batch} | {_fmt(put['items_s'])} "
                f"| {_fmt(put['cpu_us_per_item'], ',.1f')} | {rt_put} "
                f"| {_fmt(ack['items_s'])} | {_fmt(ack['cpu_us_per_item'], ',.1f')} | {rt_ack} "
                f"| {_fmt(put['items_s_min'])}–{_fmt(put['items_s_max'])} "
                f"| {_fmt(ack['items_s_min'])}–{_fmt(ack['items_s_max'])} |"
            )
    if result["ratios"]:
        lines += [
            "",
            "fleetcron ÷ peer, items/s on the same PostgreSQL (above 1: fleetcron faster);"
            " ratio of medians (paired by round in brackets)",
            "",
            "| fleetcron | peer | op | " + " | ".join(f"batch {b}" for b in batches) + " |",
            "|---|---|---|" + "---|" * len(batches),
        ]
        keys = sorted(
            {(r["fleetcron"], r["peer"], r["op"]) for r in result["ratios"]},
            key=lambda k: (FLEETCRON_PG.index(k[0]), PEERS.index(k[1]), OPS.index(k[2])),
        )
        for fc, peer, op in keys:
            cells = []
            for batch in batches:
                found = next(
                    (
                        r for r in result["ratios"]
                        if (r["fleetcron"], r["peer"], r["op"], r["batch"]) == (fc, peer, op, batch)
                    ),
                    None,
                )  # fmt: skip
                cells.append(
                    "–"
                    if found is None
                    else f"{found['ratio']:.2f}× ({_fmt(found['ratio_paired_median'], '.2f')}×)"
                )
            lines.append(f"| {fc} | {peer} | {OP_LABEL[op]} | " + " | ".join(cells) + " |")
    if result["targets"]:
        lines += ["", "| target: ahead of procrastinate and pgqueuer at batch 100 | met |"]
        lines.append("|---|---|")
        for key, t in result["targets"].items():
            detail = ", ".join(f"{p} {v:.2f}×" for p, v in t["ratios"].items())
            verdict = "yes" if t["ahead_of_both"] else "NO"
            lines.append(f"| {key} | {verdict} ({detail}) |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=10_000, help="items per cell, batch > 1")
    parser.add_argument("--items1", type=int, default=2_000, help="items per cell, batch 1")
    parser.add_argument("--batches", default="1,10,100", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--only", default="", help="comma-separated substrings of subject keys")
    parser.add_argument("--no-rt", dest="rt", action="store_false", help="skip the RT pass")
    parser.add_argument(
        "--no-vacuum",
        dest="vacuum",
        action="store_false",
        help="do not VACUUM (ANALYZE) the PostgreSQL subjects' tables after each cell",
    )
    parser.add_argument("--seed", type=int, default=None, help="shuffle seed (default: random)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument(
        "--smoke", action="store_true", help="quick check: 300/60 items, 1 round (< 1 minute)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.items, args.items1, args.rounds = 300, 60, 1
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**32)
    return args


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: list[str] | None = None) -> int:
    # procrastinate warns that its App is made in __main__: it matters to a worker that
    # imports tasks by path, not here, where the jobs are drained by hand.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    args = parse_args(argv)
    locks = _load_locks()
    with quiet():
        result = run(args, locks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\n(results: {args.out}; {result['meta']['duration_s']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
