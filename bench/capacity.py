"""Capacity harness: store work per run against the number of replicas R.

Run from the project root::

    .venv/bin/python bench/capacity.py --replicas 10,100 --jobs 2000 --every-scale 30 \
        --duration 120 --processes 2

Method, per R in ``--replicas``: a fresh PostgreSQL database (dropped at the end), a fresh
namespace, and P worker processes (``--processes``), each running its share of the R
replicas as asyncio tasks: every replica is a real ``AsyncScheduler`` in claim mode over
the same N jobs, with the default options of a deployed replica (heartbeat, ring reads,
store clock, monitor lease) unless ``--monitors`` says otherwise. Each replica talks to the
store either over a connection of its own or, when the server has not that many
connections to spare (``SHOW max_connections``), through a small pool of connections
shared by the replicas of its process (``--connections``; one operation holds one pooled
connection for one round trip, as an operation does on a connection of its own).

The jobs (``--jobs`` N): a share ``--cron-share`` of cron jobs ``*/5 * * * *`` without
jitter (the burst at :00/:05), a share ``--fast-share`` of ``every = "1m"``, the rest
``every = "5m"``. ``--every-scale K`` divides the ``every`` intervals by K so that a run of
two or three minutes sees several rounds (K = 30: 5 m -> 10 s, 1 m -> 2 s); cron has
minute granularity, so scaled cron jobs run ``* * * * *`` (a burst at every :00).

Measured over a window of ``--duration`` seconds after every replica has started:

- store operations, counted client-side by wrapping ``store.run`` of every replica, by
  operation name (run_claim, run_finish_many, run_settled, replica_list, replica_beat,
  store_now, ...), per run and per second;
- server side, the window's delta of ``pg_stat_database.xact_commit`` and of the rows read
  (``seq_tup_read + idx_tup_fetch`` of ``pg_stat_user_tables``: every table of the fresh
  database is fleetcron's), per run; the CPU of the server backends of the run's database
  (their ``/proc`` times; background processes and other databases are not counted);
- from the ledger: slots due in the window run once, twice (a job function executed more
  than once for one slot), never; rows ``missed``/``skipped``; fire lag p50/p99.

Results: a markdown table on stdout, ``bench/results/capacity.json`` (``--out``) and the
plot ``docs/img/capacity_ops_per_run.png`` (``--plot``; store operations per run and fire
lag p99 against R).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler import (  # bench/ is not a package: its folder is on sys.path
    BACKENDS,
    CLAIMED,
    fresh_database,
    percentile,
    proc_cpu_s,
    rss_mb,
    store_call,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "capacity.json"
PLOT = ROOT / "docs" / "img" / "capacity_ops_per_run.png"
RESERVE_CONNECTIONS = 20  # left to the parent, other users of the server and superusers

# -- the jobs -------------------------------------------------------------------------------


def job_name(i: int) -> str:
    return f"job-{i:06d}"


def job_kinds(args: argparse.Namespace) -> list[str]:
    """Each job's kind, ``cron``, ``fast`` (1 m) or ``slow`` (5 m): ``round(N × share)``
    of each, spread evenly over the names so that no kind sits on one end of the list."""
    n = args.jobs
    kinds = ["slow"] * n
    n_cron = round(n * args.cron_share)
    for k in range(n_cron):
        kinds[k * n // n_cron] = "cron"
    rest = [i for i in range(n) if kinds[i] == "slow"]
    n_fast = min(len(rest), round(n * args.fast_share))
    for k in range(n_fast):
        kinds[rest[k * len(rest) // n_fast]] = "fast"
    return kinds


def job_options(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    scale = args.every_scale
    if kind == "cron":
        minutes = max(1, int(5 / scale))
        return {"schedule": "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"}
    seconds = (300 if kind == "slow" else 60) / scale
    return {"every": timedelta(seconds=seconds), "jitter": timedelta(seconds=seconds * args.jitter)}


def job_specs(args: argparse.Namespace) -> list[Any]:
    from fleetcron.job_options import job_spec

    return [
        job_spec(job_name(i), where="bench", call=noop, overlap="skip", **job_options(kind, args))
        for i, kind in enumerate(job_kinds(args))
    ]


# -- the worker process (R/P replicas) ------------------------------------------------------

_EXECUTED: list[tuple[str, int]] = []


def noop(ctx: Any) -> None:
    """The benchmark's job: do nothing but note which slot this process ran."""
    _EXECUTED.append((ctx.job, ctx.slot_us))


class Pool:
    """A few async store connections shared by many replicas: an operation takes a free
    connection for its one round trip (the operations of the ledger are autocommit)."""

    def __init__(self, stores: list[Any]) -> None:
        self.stores = stores
        self.waits: list[tuple[float, float]] = []
        """``[wall time, ms waited for a free connection]`` of each operation."""
        self._free: asyncio.Queue[Any] = asyncio.Queue()
        for store in stores:
            self._free.put_nowait(store)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stores[0], name)

    async def run(self, operation: Any) -> Any:
        before = time.monotonic()
        store = await self._free.get()
        self.waits.append((time.time(), (time.monotonic() - before) * 1e3))
        try:
            return await store.run(operation)
        finally:
            self._free.put_nowait(store)

    async def close(self) -> None:
        for store in self.stores:
            with contextlib.suppress(Exception):
                await store.close()


class Counted:
    """One replica's face of its store: counts ``run()`` by operation name and second, in
    counters shared by the replicas of the process; closing it leaves the store open."""

    def __init__(
        self,
        inner: Any,
        by_second: dict[int, Counter[str]],
        total: Counter[str],
        times: dict[str, list[tuple[float, float]]],
    ) -> None:
        self._inner = inner
        self._by_second = by_second
        self.total = total
        self._times = times  # by operation: [wall time, ms from call to answer]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def run(self, operation: Any) -> Any:
        name = getattr(operation, "__name__", type(operation).__name__)
        self._by_second[int(time.time())][name] += 1
        self.total[name] += 1
        before = time.monotonic()
        try:
            return await self._inner.run(operation)
        finally:
            self._times[name].append((time.time(), (time.monotonic() - before) * 1e3))

    async def close(self) -> None:
        return None


PROBE_S = 0.1
START_BATCH = 10


async def _probe_loop(lags: list[tuple[float, float]]) -> None:
    """How late this process's event loop wakes a sleeper (``[wall time, ms late]``): with
    hundreds of replicas in one process this, not the store, can be where lag comes from."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(PROBE_S)
        lags.append((time.time(), (time.monotonic() - before - PROBE_S) * 1e3))


def _write(path: str, text: str) -> None:
    """Write a file whole: the parent polls for it."""
    Path(path + ".tmp").write_text(text)
    os.replace(path + ".tmp", path)


async def worker_main(args: argparse.Namespace) -> None:
    from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
    from fleetcron.scheduling.monitor import DEFAULT_MONITOR_S
    from fleetcron.scheduling.retention import DEFAULT_RETENTION_S
    from fleetcron.stores import open_async_store, parse_store_url

    jobs = job_specs(args)
    first, count = args.first, args.count
    url = parse_store_url(args.url)
    own = args.connections >= count
    stores = [await open_async_store(url) for _ in range(count if own else args.connections)]
    pool = None if own else Pool(stores)
    by_second: dict[int, Counter[str]] = defaultdict(Counter)
    times: dict[str, list[tuple[float, float]]] = defaultdict(list)
    schedulers = []
    counters = []
    for k in range(count):
        index = first + k
        counter: Counter[str] = Counter()
        counted = Counted(stores[k] if pool is None else pool, by_second, counter, times)
        monitor = args.monitors < 0 or index < args.monitors
        options = SchedulerOptions(
            namespace=args.namespace,
            concurrency=args.concurrency,
            echo=False,
            monitor_s=DEFAULT_MONITOR_S if monitor else 0,
            retention_s=DEFAULT_RETENTION_S if monitor else 0,
        )
        schedulers.append(AsyncScheduler(counted, jobs, options))
        counters.append(counter)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop_lags: list[tuple[float, float]] = []
    probe = asyncio.create_task(_probe_loop(loop_lags))
    tasks = []
    began = time.monotonic()
    # Start START_BATCH at a time: hundreds of registrations at once only queue on the
    # server, one at a time leaves the start-up of R = 100 at ~45 s.
    for at in range(0, len(schedulers), START_BATCH):
        batch = schedulers[at : at + START_BATCH]
        tasks += [asyncio.create_task(scheduler.run()) for scheduler in batch]
        await asyncio.gather(*(scheduler.signals.started.wait() for scheduler in batch))
    ready = {"pid": os.getpid(), "start_s": time.monotonic() - began}
    _write(args.ready_file, json.dumps(ready))
    await stop.wait()
    probe.cancel()
    for scheduler in schedulers:
        scheduler.stop()
    await asyncio.gather(*tasks, return_exceptions=True)
    if pool is not None:
        await pool.close()
    else:
        for store in stores:
            with contextlib.suppress(Exception):
                await store.close()
    report = {
        "pid": os.getpid(),
        "holders": {s.holder: first + k for k, s in enumerate(schedulers)},
        "executed": list(_EXECUTED),
        "ops": {str(k): dict(v) for k, v in by_second.items()},
        "ops_per_replica": [sum(c.values()) for c in counters],
        "loop_lags": loop_lags,
        "pool_waits": [] if pool is None else pool.waits,
        "op_times": times,
    }
    _write(args.report_file, json.dumps(report))


# -- the server's figures -------------------------------------------------------------------


def server_stats(url: str) -> dict[str, Any]:
    """xact_commit of the run's database, rows read from its tables, and the CPU seconds of
    its backends (by pid, so that a later reading adds only the same backends)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        with contextlib.suppress(Exception):
            conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        xact = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        rows = conn.execute(
            "SELECT coalesce(sum(seq_tup_read), 0), coalesce(sum(idx_tup_fetch), 0),"
            " coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
        ).fetchone()
        tables = conn.execute(
            "SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
            " FROM pg_stat_user_tables"
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexrelname, coalesce(idx_tup_read, 0) FROM pg_stat_user_indexes"
        ).fetchall()
        pids = [
            int(r[0])
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
    return {
        "xact_commit": int(xact[0]) if xact else 0,
        "seq_tup_read": int(rows[0]) if rows else 0,
        "idx_tup_fetch": int(rows[1]) if rows else 0,
        "tup_written": int(rows[2]) if rows else 0,
        "rows_read_by_table": {str(name): int(n) for name, n in tables},
        "index_entries_read_by_index": {str(name): int(n) for name, n in indexes},
        "backend_cpu": {str(pid): proc_cpu_s(pid) for pid in pids},
    }


def connection_budget(url: str) -> tuple[int, int]:
    """``max_connections`` of the server and how many connections are open now."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        limit = conn.execute("SHOW max_connections").fetchone()
        used = conn.execute("SELECT count(*) FROM pg_stat_activity").fetchone()
    return int(limit[0]) if limit else 0, int(used[0]) if used else 0


# -- one run at one R -----------------------------------------------------------------------


def run_one(args: argparse.Namespace, replicas: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-capacity-"))
    base = BACKENDS.get(args.backend, args.backend)
    if not base.startswith(("postgresql://", "postgres://")):
        raise SystemExit("bench/capacity.py: --backend must be postgres or a PostgreSQL URL")
    with fresh_database(base, True, keep=args.keep) as url:
        try:
            return _run_one(args, replicas, tmp, url)
        finally:
            for path in tmp.iterdir():
                path.unlink(missing_ok=True)
            tmp.rmdir()


def _run_one(args: argparse.Namespace, replicas: int, tmp: Path, url: str) -> dict[str, Any]:
    started = time.time()
    namespace = f"bench-cap-{secrets.token_hex(4)}"
    store_call(url, lambda ops: ops.store_now())  # creates the schema
    processes = max(1, min(args.processes, replicas))
    limit, used = connection_budget(url)
    spare = max(processes, limit - used - RESERVE_CONNECTIONS)
    per_process = -(-replicas // processes)
    connections = args.connections or per_process
    if connections * processes > spare:
        connections = max(1, spare // processes)
    print(
        f"R={replicas}: {processes} processes, {connections} connection(s) each"
        f" (max_connections {limit}, {used} open); namespace {namespace}",
        file=sys.stderr,
    )
    procs: list[subprocess.Popen[bytes]] = []
    ready = [tmp / f"ready-{i}" for i in range(processes)]
    reports = [tmp / f"report-{i}.json" for i in range(processes)]
    window: dict[str, Any] = {}
    try:
        first = 0
        for i in range(processes):
            count = replicas // processes + (1 if i < replicas % processes else 0)
            cmd = [
                sys.executable, str(Path(__file__).resolve()), "--worker",
                "--url", url, "--namespace", namespace,
                "--jobs", str(args.jobs), "--cron-share", str(args.cron_share),
                "--fast-share", str(args.fast_share), "--every-scale", str(args.every_scale),
                "--jitter", str(args.jitter), "--concurrency", str(args.concurrency),
                "--monitors", str(args.monitors), "--connections", str(connections),
                "--first", str(first), "--count", str(count),
                "--ready-file", str(ready[i]), "--report-file", str(reports[i]),
            ]  # fmt: skip
            first += count
            procs.append(subprocess.Popen(cmd, cwd=ROOT))
        deadline = time.time() + args.startup_timeout
        while not all(p.exists() for p in ready):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited during start-up")
            if time.time() > deadline:
                raise RuntimeError("replicas did not start in time")
            time.sleep(0.1)
        window["startup_s"] = time.time() - started
        time.sleep(args.settle)  # every replica has read the ring with every member in it
        window["wall_start"] = time.time()
        window["start_us"] = store_call(url, lambda ops: ops.store_now())
        window["server_start"] = server_stats(url)
        window["client_cpu_start"] = sum(proc_cpu_s(p.pid) for p in procs)
        print(f"ready after {window['startup_s']:.1f} s; measuring {args.duration} s",
              file=sys.stderr)  # fmt: skip
        time.sleep(args.duration)
        window["client_cpu_end"] = sum(proc_cpu_s(p.pid) for p in procs)
        window["server_end"] = server_stats(url)
        window["rss_mb"] = [rss_mb(p.pid) or 0.0 for p in procs]
        window["end_us"] = store_call(url, lambda ops: ops.store_now())
        window["wall_end"] = time.time()
        # The slots due just before the window's end are claimed after it: keep the
        # replicas running so that a late claim is not counted as a slot never run.
        time.sleep(args.tail)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    worker_reports = [json.loads(p.read_text()) for p in reports if p.exists()]
    rows = store_call(url, lambda ops: ops.run_list(namespace, None, 10_000_000))
    result = summarise(args, replicas, window, rows, worker_reports)
    result["meta"].update(
        {
            "replicas": replicas,
            "processes": processes,
            "connections_per_process": connections,
            "own_connection_per_replica": connections >= per_process,
            "max_connections": limit,
            "connections_open_before": used,
            "startup_s": round(window["startup_s"], 1),
            "duration_s": round(time.time() - started, 1),
        }
    )
    return result


def expected_slots(args: argparse.Namespace, lo: int, hi: int) -> dict[tuple[str, int], int]:
    """Every slot whose fire time is in ``[lo, hi]``, with that fire time."""
    from fleetcron.schedules import jitter_us

    expected: dict[tuple[str, int], int] = {}
    for spec in job_specs(args):
        for slot in spec.schedule.slots_between(lo - spec.jitter_us - 1, hi, limit=1_000_000):
            fire = slot + jitter_us(spec.name, slot, spec.jitter_us)
            if lo <= fire <= hi:
                expected[(spec.name, slot)] = fire
    return expected


def summarise(
    args: argparse.Namespace,
    replicas: int,
    window: dict[str, Any],
    rows: list[Any],
    reports: list[dict[str, Any]],
) -> dict[str, Any]:
    lo = int(window["start_us"]) + 1_000_000
    hi = int(window["end_us"]) - 1_000_000
    expected = expected_slots(args, lo, hi)
    by_key = {(r.job, r.slot_us): r for r in rows}
    runs = [by_key[k] for k in expected if k in by_key and by_key[k].state in CLAIMED]
    states = Counter(by_key[k].state for k in expected if k in by_key)
    never = [k for k in expected if k not in by_key or by_key[k].state not in CLAIMED]
    executed: Counter[tuple[str, int]] = Counter()
    for rep in reports:
        executed.update((job, slot) for job, slot in rep["executed"])
    once = sum(1 for k in expected if executed.get(k) == 1)
    twice = sum(1 for k in expected if executed.get(k, 0) > 1)
    lags_ms = [(r.started_us - expected[(r.job, r.slot_us)]) / 1e3 for r in runs if r.started_us]
    holders: dict[str, int] = {}
    for rep in reports:
        holders.update(rep["holders"])
    per_replica: Counter[int] = Counter(holders.get(r.holder, -1) for r in runs)
    ops_per_replica = [n for rep in reports for n in rep["ops_per_replica"]]
    # store operations over the window's whole seconds
    s_lo, s_hi = int(window["wall_start"]) + 1, int(window["wall_end"])
    seconds = max(1, s_hi - s_lo)
    by_name: Counter[str] = Counter()
    for rep in reports:
        for k, counts in rep["ops"].items():
            if s_lo <= int(k) < s_hi:
                by_name.update(counts)
    ops = sum(by_name.values())
    pool_waits = [
        waited for rep in reports for at, waited in rep.get("pool_waits", []) if s_lo <= at < s_hi
    ]
    op_times: dict[str, list[float]] = defaultdict(list)
    for rep in reports:
        for name, pairs in rep.get("op_times", {}).items():
            op_times[name] += [ms for at, ms in pairs if s_lo <= at < s_hi]
    loop_lags = [late for rep in reports for at, late in rep["loop_lags"] if s_lo <= at < s_hi]
    span_s = max(1e-9, (hi - lo) / 1e6)
    runs_per_s = len(runs) / span_s
    ops_per_run = ops / seconds / runs_per_s if runs_per_s else None
    a, b = window["server_start"], window["server_end"]
    server_s = window["wall_end"] - window["wall_start"]
    server_runs = runs_per_s * server_s  # runs over the span the server figures cover
    xact = b["xact_commit"] - a["xact_commit"]
    rows_read = (b["seq_tup_read"] + b["idx_tup_fetch"]) - (a["seq_tup_read"] + a["idx_tup_fetch"])
    seq_read = b["seq_tup_read"] - a["seq_tup_read"]
    backend_cpu = sum(
        max(0.0, cpu - a["backend_cpu"][pid])
        for pid, cpu in b["backend_cpu"].items()
        if pid in a["backend_cpu"]
    )
    client_cpu = window["client_cpu_end"] - window["client_cpu_start"]

    def per_run(value: float) -> float | None:
        return value / server_runs if server_runs else None

    summary = {
        "slots": len(expected),
        "runs": len(runs),
        "slots_run_once": once,
        "slots_run_twice": twice,
        "slots_never_run": len(never),
        "never_run_examples": [list(k) for k in sorted(never)[:5]],
        "states": dict(states),
        "slots_missed": states.get("missed", 0),
        "slots_skipped": states.get("skipped", 0),
        "lag_ms_p50": percentile(lags_ms, 50),
        "lag_ms_p99": percentile(lags_ms, 99),
        "lag_ms_max": max(lags_ms) if lags_ms else None,
        "runs_per_s": runs_per_s,
        "event_loop_late_ms_p50": percentile(loop_lags, 50),
        "event_loop_late_ms_p99": percentile(loop_lags, 99),
        "event_loop_late_ms_max": max(loop_lags, default=None),
        "store_ops_per_replica_s": ops / seconds / replicas,
        "pool_wait_ms_p99": percentile(pool_waits, 99),
        "pool_wait_ms_max": max(pool_waits, default=None),
        "op_ms_p50_p99_max_by_name": {
            name: [percentile(ms, 50), percentile(ms, 99), max(ms)]
            for name, ms in sorted(op_times.items())
            if ms
        },
        "count_seconds": seconds,
        "store_ops": ops,
        "store_ops_per_s": ops / seconds,
        "store_ops_per_run": ops_per_run,
        "store_ops_per_run_by_name": {
            k: v / seconds / runs_per_s if runs_per_s else None for k, v in by_name.most_common()
        },
        "store_ops_per_s_by_name": {k: v / seconds for k, v in by_name.most_common()},
        "store_ops_per_replica_s_min": min(ops_per_replica, default=0),
        "store_ops_per_replica_max": max(ops_per_replica, default=0),
        "runs_per_replica_min": min((per_replica.get(i, 0) for i in range(replicas)), default=0),
        "runs_per_replica_max": max(per_replica.values(), default=0),
        "xact_commit": xact,
        "xact_commit_per_run": per_run(xact),
        "xact_commit_per_s": xact / server_s,
        "rows_read": rows_read,
        "rows_read_per_run": per_run(rows_read),
        "seq_tup_read_per_run": per_run(seq_read),
        "rows_read_per_run_by_table": {
            name: per_run(n - a["rows_read_by_table"].get(name, 0))
            for name, n in sorted(b["rows_read_by_table"].items())
        },
        "index_entries_read_per_run_by_index": {
            name: per_run(n - a.get("index_entries_read_by_index", {}).get(name, 0))
            for name, n in sorted(b.get("index_entries_read_by_index", {}).items())
        },
        "rows_written_per_run": per_run(b["tup_written"] - a["tup_written"]),
        "server_cpu_s": backend_cpu,
        "server_cpu_ms_per_run": None if not server_runs else 1e3 * backend_cpu / server_runs,
        "server_cpu_cores": backend_cpu / server_s,
        "client_cpu_cores": client_cpu / server_s,
        "client_cpu_ms_per_run": None if not server_runs else 1e3 * client_cpu / server_runs,
        "rss_mb_per_process_max": max(window["rss_mb"], default=None),
    }
    return {
        "meta": {
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(window["wall_start"])),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "job_kinds": dict(Counter(job_kinds(args))),
            "window_us": [int(window["start_us"]), int(window["end_us"])],
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "summary": summary,
    }


# -- output ---------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ",.2f") -> str:
    return "–" if value is None else format(value, spec)


def markdown(results: list[dict[str, Any]]) -> str:
    head = (
        "| R | procs × conns | slots | once / twice / never / missed | runs/s "
        "| store ops/run | store ops/s | ops/replica/s | xact/run | rows read/run "
        "| server CPU ms/run | lag p50 / p99 (ms) | worker loop late / pool wait p99 (ms) |"
    )
    lines = [head, "|" + "---|" * 13]
    for res in results:
        m, s = res["meta"], res["summary"]
        conns = f"{m['processes']} × {m['connections_per_process']}" + (
            "" if m["own_connection_per_replica"] else " (pool)"
        )
        lines.append(
            f"| {m['replicas']} | {conns} | {s['slots']:,} | {s['slots_run_once']:,} / "
            f"{s['slots_run_twice']} / {s['slots_never_run']} / {s['slots_missed']} "
            f"| {_fmt(s['runs_per_s'], ',.1f')} | {_fmt(s['store_ops_per_run'])} "
            f"| {_fmt(s['store_ops_per_s'], ',.0f')} | {_fmt(s['store_ops_per_replica_s'])} "
            f"| {_fmt(s['xact_commit_per_run'])} "
            f"| {_fmt(s['rows_read_per_run'], ',.1f')} | {_fmt(s['server_cpu_ms_per_run'])} "
            f"| {_fmt(s['lag_ms_p50'], ',.0f')} / {_fmt(s['lag_ms_p99'], ',.0f')} "
            f"| {_fmt(s['event_loop_late_ms_p99'], ',.0f')} / "
            f"{_fmt(s.get('pool_wait_ms_p99'), ',.0f')} |"
        )
    for res in results:  # what each replica costs whatever the runs: the per-R growth
        summary, r = res["summary"], res["meta"]["replicas"]
        summary["store_ops_per_replica_s_by_name"] = {
            name: n / r for name, n in summary["store_ops_per_s_by_name"].items()
        }
    for key, title in (
        ("store_ops_per_run_by_name", "Store operations per run, by operation"),
        ("store_ops_per_replica_s_by_name", "Store operations per replica per second"),
        (
            "rows_read_per_run_by_table",
            "Rows read per run (seq_tup_read + idx_tup_fetch), by table",
        ),
        ("index_entries_read_per_run_by_index", "Index entries read per run, by index"),
    ):
        lines += ["", f"{title}:", "", _breakdown(results, key)]
    return "\n".join(lines)


def _breakdown(results: list[dict[str, Any]], key: str) -> str:
    """One row per name of ``summary[key]`` (largest at the largest R first), one column
    per R; names that are 0 or absent at every R are left out."""
    names: list[str] = []
    for res in results:
        names += [n for n in res["summary"].get(key, {}) if n not in names]
    last = results[-1]["summary"].get(key, {})
    names.sort(key=lambda n: -(last.get(n) or 0))
    lines = ["| | " + " | ".join(f"R={r['meta']['replicas']}" for r in results) + " |"]
    lines.append("|---|" + "---|" * len(results))
    for name in names:
        values = [r["summary"].get(key, {}).get(name) for r in results]
        if not any(values):
            continue
        lines.append(f"| {name} | " + " | ".join(_fmt(v, ",.3f") for v in values) + " |")
    return "\n".join(lines)


def _series_label(results: list[dict[str, Any]]) -> str:
    a, kinds = results[0]["meta"]["args"], results[0]["meta"]["job_kinds"]
    jitter = f", jitter {a['jitter']}×" if a.get("jitter") not in (None, 0, "0s") else ""
    return f"N={a['jobs']:,} ({kinds.get('cron', 0)} cron), every ÷ {a['every_scale']:g}{jitter}"


def plot(series: list[list[dict[str, Any]]], out: Path) -> None:
    """Store operations per run (all, and the largest operations of the first series) and
    fire lag p99 against R, one line per series (one invocation's results)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ops_ax, lag_ax) = plt.subplots(1, 2, figsize=(12, 4.6))
    for results in series:
        xs = [r["meta"]["replicas"] for r in results]
        label = _series_label(results)
        ops_ax.plot(xs, [r["summary"]["store_ops_per_run"] for r in results], "o-", label=label)
        lag_ax.plot(xs, [r["summary"]["lag_ms_p99"] for r in results], "o-", label=label)
        for ax, key in ((ops_ax, "store_ops_per_run"), (lag_ax, "lag_ms_p99")):
            bad = [r for r in results if r["summary"]["slots_never_run"]]
            ax.plot(
                [r["meta"]["replicas"] for r in bad],
                [r["summary"][key] for r in bad],
                "rx",
                markersize=11,
                label="slots not run" if results is series[-1] else None,
            )
    last = series[0]
    names: list[str] = []
    for res in last:
        names += [n for n in res["summary"]["store_ops_per_run_by_name"] if n not in names]
    names.sort(key=lambda n: -(last[-1]["summary"]["store_ops_per_run_by_name"].get(n) or 0))
    xs = [r["meta"]["replicas"] for r in last]
    for name in names[:6]:
        ys = [r["summary"]["store_ops_per_run_by_name"].get(name) or 0 for r in last]
        jobs = last[0]["meta"]["args"]["jobs"]
        ops_ax.plot(xs, ys, ".--", linewidth=1, label=f"  {name} (N={jobs:,})")
    ops_ax.axhline(1.2, color="grey", linestyle=":", label="target 1.2")
    ops_ax.set_xscale("log")
    ops_ax.set_xlabel("replicas R")
    ops_ax.set_ylabel("store operations per run")
    ops_ax.set_title("Store operations per run (counted in the replicas)")
    ops_ax.legend(fontsize=7)
    lag_ax.set_xscale("log")
    lag_ax.set_yscale("log")
    lag_ax.set_xlabel("replicas R")
    lag_ax.set_ylabel("fire lag p99 (ms)")
    lag_ax.set_title("Fire lag p99 (slot + jitter → started, store clock)")
    lag_ax.legend(fontsize=7)
    fig.suptitle("bench/capacity.py on PostgreSQL, one 2-vCPU machine", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--replicas", "-r", default="10,100", help="R values, comma-separated (default 10,100)"
    )
    parser.add_argument("--jobs", "-n", type=int, default=2000, help="N jobs")
    parser.add_argument("--cron-share", type=float, default=0.05, help="share of cron jobs")
    parser.add_argument("--fast-share", type=float, default=0.01, help="share of 1 m jobs")
    parser.add_argument(
        "--every-scale", type=float, default=1.0, help="divide the `every` intervals by this"
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="`jitter` of the every jobs, as a share of their interval (0 to 0.9)",
    )
    parser.add_argument("--duration", "-d", type=float, default=120.0, help="seconds measured")
    parser.add_argument(
        "--settle",
        type=float,
        default=12.0,
        help="seconds between the last start and the window (a ring read)",
    )
    parser.add_argument(
        "--tail",
        type=float,
        default=10.0,
        help="seconds the replicas keep running after the window (its last slots' claims)",
    )
    parser.add_argument("--processes", "-p", type=int, default=2, help="P worker processes")
    parser.add_argument(
        "--connections",
        type=int,
        default=0,
        help="store connections per process (default: one per replica, "
        "or what the server can spare, shared)",
    )
    parser.add_argument(
        "--monitors",
        type=int,
        default=-1,
        help="replicas with the monitor on (default -1: all, as deployed)",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--backend", default="postgres", help="postgres or a PostgreSQL URL")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep the run's database")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--plot", type=Path, default=PLOT, help="the plot (PNG)")
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="+",
        help="no run: draw --plot from these results files (one line each) and print tables",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    parser.add_argument("--report-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)  # fmt: skip
    if not args.worker:
        try:
            args.replicas = [int(r) for r in str(args.replicas).split(",") if r.strip()]
        except ValueError:
            parser.error(f"--replicas: a comma-separated list of integers, not {args.replicas!r}")
        if not args.replicas or min(args.replicas) < 1:
            parser.error("--replicas: every R must be at least 1")
        if args.jobs < 1 or args.every_scale <= 0 or args.duration <= 0 or args.processes < 1:
            parser.error("--jobs, --every-scale, --duration and --processes must be positive")
        if not 0 <= args.jitter <= 0.9:
            parser.error("--jitter: a share of the interval, from 0 to 0.9")
        if not (0 <= args.cron_share + args.fast_share <= 1):
            parser.error("--cron-share + --fast-share must be between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        asyncio.run(worker_main(args))
        return 0
    if args.replot:
        series = [json.loads(path.read_text()) for path in args.replot]
        for results in series:
            print(f"{_series_label(results)}:\n\n{markdown(results)}\n")
        plot(series, args.plot)
        return 0
    results = []
    for replicas in args.replicas:
        results.append(run_one(args, replicas))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    plot([results], args.plot)
    print(f"\n(results: {args.out}; plot: {args.plot})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
