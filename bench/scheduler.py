"""Scheduler exactly-once benchmark: N jobs x R replica processes claiming the same slots.

Run from the project root::

    .venv/bin/python bench/scheduler.py                         # N=200, R=4, D=20 s (~40 s)
    .venv/bin/python bench/scheduler.py --jobs 1000 --replicas 8 \
        --out bench/results/scheduler-1000x8.json
    .venv/bin/python bench/scheduler.py --backend redis --jobs 50 --replicas 2 --duration 10

Method: the parent picks a fresh namespace and starts R replicas, each a separate process
running this script with ``--replica``. A replica opens its own async store and runs
``AsyncScheduler(store, jobs, SchedulerOptions(namespace=ns, concurrency=C, echo=False))`` over
the same N jobs (``every`` = ``--every``, ``call`` = :func:`noop`, a module-level function
that only notes which slot it ran). Once every replica has registered its jobs the parent
reads the store's clock (window start), waits ``--duration`` seconds, reads it again
(window end) and sends SIGTERM; each replica calls ``scheduler.stop()``, drains and writes
what it saw (slots it executed, ticks and store operations per wall-clock second) to a
JSON file. The parent then reads the namespace's whole ledger with ``run_list`` and reports:

- slots due inside the window (slot times from window start + 1 s to window end - 1 s
  - ``--jitter``);
- runs (ledger rows of those slots that were claimed: ``running``/``succeeded``/``failed``);
- slots run twice: slots :func:`noop` executed more than once across all replicas (an
  independent check; the ledger's primary key cannot show two rows for one slot), plus
  ledger rows with ``attempt > 1``;
- slots never run inside the window, and rows ``skipped``/``missed``;
- fire lag = ``started_us`` − fire time (the slot plus the job's jitter for it; both the
  store's clock), p50/p99/max;
- the share of runs per replica (from the ``host:pid`` prefix of ``holder``), min/max as a
  multiple of the fair share 1/R;
- store operations per tick and per run, counted in each replica by wrapping
  ``store.run`` (one operation = one round trip by the ledger contract), over the window's
  whole seconds; on PostgreSQL also the ``pg_stat_database.xact_commit`` delta of the
  database over the replicas' whole life, as a server-side cross-check.

Results: a markdown table on stdout and ``bench/results/scheduler.json`` (``--out``).
On PostgreSQL and MySQL each run has a fresh database on the server, dropped at the end
(``--shared-database`` runs in the URL's own database instead, and prunes the namespace's
finished ledger rows at the end); ``--keep`` keeps either.
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
import threading
import time
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "scheduler.json"
BACKENDS = {
    "postgres": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
    "redis": "redis://127.0.0.1:6379/0",
}
CLAIMED = ("running", "succeeded", "failed", "cancelled", "lost")

# -- the job target (runs inside a replica) ----------------------------------------------

_IMPORTED = time.monotonic()  # the replica's clock starts when this module is imported
_EXECUTED: list[tuple[str, int]] = []
_EXECUTED_LOCK = threading.Lock()


def noop(ctx: Any) -> None:
    """The benchmark's job: do nothing but note which slot this process ran."""
    with _EXECUTED_LOCK:
        _EXECUTED.append((ctx.job, ctx.slot_us))


class CountingStore:
    """Delegates to an async store; counts ``run()`` calls by operation name and second."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.by_second: dict[int, Counter[str]] = defaultdict(Counter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def run(self, operation: Any) -> Any:
        name = getattr(operation, "__name__", type(operation).__name__)
        self.by_second[int(time.time())][name] += 1
        return await self._inner.run(operation)


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


def job_name(i: int) -> str:
    return f"job-{i:05d}"


async def replica_main(args: argparse.Namespace) -> None:
    from fleetcron.durations import parse_duration
    from fleetcron.job_options import job_spec
    from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
    from fleetcron.stores import open_async_store, parse_store_url

    began = time.monotonic()
    jobs = [
        job_spec(
            job_name(i),
            where="bench",
            call=noop,
            every=args.every,
            overlap=args.overlap,
            jitter=args.jitter,
        )
        for i in range(args.jobs)
    ]
    specs_s = time.monotonic() - began
    store = await open_async_store(parse_store_url(args.url))
    counting = CountingStore(store)
    scheduler = AsyncScheduler(
        counting,  # type: ignore[arg-type]
        jobs,
        SchedulerOptions(
            namespace=args.namespace,
            concurrency=args.concurrency,
            echo=False,
            mode=args.mode,
            leader_ttl_us=int(parse_duration(args.leader_ttl)),
        ),
    )
    ticks: Counter[int] = Counter()
    tick = scheduler._tick  # wrapped on the instance to count ticks exactly

    async def counted_tick(loop_time: float) -> None:
        ticks[int(time.time())] += 1
        await tick(loop_time)

    scheduler._tick = counted_tick  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, scheduler.stop)
    loop.add_signal_handler(signal.SIGINT, scheduler.stop)
    before_run = time.monotonic()
    task = asyncio.create_task(scheduler.run())
    await scheduler.signals.started.wait()
    ready = {
        "pid": os.getpid(),
        "import_s": began - _IMPORTED,
        "specs_s": specs_s,
        "register_s": time.monotonic() - before_run,
    }
    _write(args.ready_file + ".tmp", json.dumps(ready))
    os.replace(args.ready_file + ".tmp", args.ready_file)
    try:
        await task
    finally:
        with contextlib.suppress(Exception):
            await store.close()
    with _EXECUTED_LOCK:
        executed = list(_EXECUTED)
    report = {
        "pid": os.getpid(),
        "holder": scheduler.holder,
        "executed": executed,
        "ticks": {str(k): v for k, v in ticks.items()},
        "ops": {str(k): dict(v) for k, v in counting.by_second.items()},
    }
    _write(args.report_file, json.dumps(report))


# -- the parent ------------------------------------------------------------------------


async def _store_call(url: str, build: Any) -> Any:
    from fleetcron.stores import open_async_store, parse_store_url

    store = await open_async_store(parse_store_url(url))
    try:
        return await store.run(build(store.ops))
    finally:
        await store.close()


def store_call(url: str, build: Any) -> Any:
    return asyncio.run(_store_call(url, build))


def pg_xact_commit(url: str) -> int | None:
    if not url.startswith(("postgresql://", "postgres://")):
        return None
    try:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            with contextlib.suppress(Exception):
                conn.execute("SELECT pg_stat_force_next_flush()")
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            return int(row[0]) if row else None
    except Exception:
        return None


SERVER_PROCESSES = {
    "postgres": ("postgres",),
    "mysql": ("mariadbd", "mysqld"),
    "redis": ("redis-server",),
}


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the command: state is field 3; utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postmaster_pid(url: str) -> int | None:
    """The pid of the local PostgreSQL server behind ``url`` (the parent of a backend),
    or ``None`` when it cannot be read on this host."""
    try:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            # Read while the backend lives: it exits with the connection.
            stat = Path(f"/proc/{int(row[0])}/stat").read_text().rsplit(")", 1)[1].split()
        return int(stat[1])  # ppid
    except Exception:
        return None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def server_of(backend: str, url: str) -> str:
    """What :func:`server_cpu_s` reads for this run: the PostgreSQL URL itself (its own
    server, whatever other clusters run on the host), else the backend's name."""
    return url if url.startswith(("postgresql://", "postgres://")) else backend


def server_cpu_s(backend: str) -> float | None:
    """CPU seconds of every process of the store server (all PostgreSQL backends, the
    MariaDB or Redis server), or ``None`` when the store runs in the replicas (SQLite).
    ``backend`` is a name of :data:`BACKENDS` or a PostgreSQL URL (a local server on
    any port: its postmaster and every process it started)."""
    if backend.startswith(("postgresql://", "postgres://")):
        postmaster = _postmaster_pid(backend)
        if postmaster is None:
            return None
        return sum(proc_cpu_s(pid) for pid in (postmaster, *_children(postmaster)))
    names = SERVER_PROCESSES.get(backend)
    if names is None:
        return None
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            total += proc_cpu_s(int(entry.name))
    return total


def rss_mb(pid: int) -> float | None:
    """Resident memory of one process, MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def runs_per_second(runs: list[Any], origin_us: int) -> dict[str, int]:
    """Runs started per second of the store's clock, from ``origin_us`` (may be negative)."""
    counts = Counter((r.started_us - origin_us) // 1_000_000 for r in runs if r.started_us)
    return {str(k): v for k, v in sorted(counts.items())}


def every_us(every: str) -> int:
    from fleetcron.durations import parse_duration

    return int(parse_duration(every))


def fire_time(args: argparse.Namespace) -> Any:
    """A run's fire time: its slot plus the job's deterministic jitter for that slot (what
    every replica waits for), so fire lag is the scheduler's delay, not the jitter."""
    from fleetcron.durations import parse_duration
    from fleetcron.schedules import jitter_us

    spread = int(parse_duration(args.jitter))
    return lambda r: r.slot_us + jitter_us(r.job, r.slot_us, spread)


def resolve_url(backend: str, tmp: Path) -> str:
    if backend in BACKENDS:
        return BACKENDS[backend]
    if backend == "sqlite":
        return f"sqlite:///{tmp / 'bench.db'}"
    return backend


def _database_url(url: str, database: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


def _server_sql(url: str, sql: str) -> None:
    """Run one statement on the server of a PostgreSQL or MySQL ``url``."""
    if url.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql)
        return
    import pymysql

    parts = urllib.parse.urlsplit(url)
    conn = pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=urllib.parse.unquote(parts.username or "root"),
        password=urllib.parse.unquote(parts.password or ""),
        autocommit=True,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


@contextlib.contextmanager
def fresh_database(url: str, enabled: bool, *, keep: bool = False) -> Iterator[str]:
    """A new, empty database on the server of a PostgreSQL or MySQL ``url`` for one run,
    dropped afterwards unless ``keep``: every run starts from the same state, not from the
    dead rows of the runs before it (a server without autovacuum keeps them all)."""
    if not enabled or not url.startswith(("postgresql://", "postgres://", "mysql://")):
        yield url
        return
    database = f"fleetcron_bench_{secrets.token_hex(4)}"
    quote = '"' if url.startswith("postgres") else "`"
    _server_sql(url, f"CREATE DATABASE {quote}{database}{quote}")
    try:
        yield _database_url(url, database)
    finally:
        if keep:
            print(f"kept the database {database}", file=sys.stderr)
        else:
            force = " WITH (FORCE)" if quote == '"' else ""
            with contextlib.suppress(Exception):
                _server_sql(url, f"DROP DATABASE IF EXISTS {quote}{database}{quote}{force}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-bench-"))
    fresh = not args.shared_database
    with fresh_database(resolve_url(args.backend, tmp), fresh, keep=args.keep) as url:
        return _run(args, tmp, url)


def _run(args: argparse.Namespace, tmp: Path, url: str) -> dict[str, Any]:
    started = time.time()
    namespace = f"bench-sched-{secrets.token_hex(4)}"
    print(f"namespace {namespace} on {args.backend}", file=sys.stderr)
    store_call(url, lambda ops: ops.store_now())  # migrate / check the server is up
    xact_before = pg_xact_commit(url)
    procs: list[subprocess.Popen[bytes]] = []
    ready = [tmp / f"ready-{i}" for i in range(args.replicas)]
    reports = [tmp / f"report-{i}.json" for i in range(args.replicas)]
    window: dict[str, Any] = {}
    try:
        for i in range(args.replicas):
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--replica",
                "--url", url,
                "--namespace", namespace,
                "--jobs", str(args.jobs),
                "--every", args.every,
                "--overlap", args.overlap,
                "--jitter", args.jitter,
                "--mode", args.mode,
                "--leader-ttl", args.leader_ttl,
                "--concurrency", str(args.concurrency),
                "--ready-file", str(ready[i]),
                "--report-file", str(reports[i]),
                *(["--profile", str(args.profile)] if args.profile else []),
            ]  # fmt: skip
            procs.append(subprocess.Popen(cmd, cwd=ROOT))
        deadline = time.time() + args.startup_timeout
        while not all(p.exists() for p in ready):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a replica exited during start-up")
            if time.time() > deadline:
                raise RuntimeError("replicas did not start in time")
            time.sleep(0.05)
        window["startup_s"] = time.time() - started
        window["wall_start"] = time.time()
        window["start_us"] = store_call(url, lambda ops: ops.store_now())
        window["client_cpu_start"] = sum(proc_cpu_s(p.pid) for p in procs)
        window["server_cpu_start"] = server_cpu_s(server_of(args.backend, url))
        print(
            f"{args.replicas} replicas ready after {window['startup_s']:.1f} s;"
            f" measuring {args.duration} s",
            file=sys.stderr,
        )
        time.sleep(args.duration)
        window["client_cpu_end"] = sum(proc_cpu_s(p.pid) for p in procs)
        window["server_cpu_end"] = server_cpu_s(server_of(args.backend, url))
        window["rss_mb"] = [rss_mb(p.pid) or 0.0 for p in procs]
        window["end_us"] = store_call(url, lambda ops: ops.store_now())
        window["wall_end"] = time.time()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if "end_us" not in window:
        raise RuntimeError("the run did not complete")
    xact_after = pg_xact_commit(url)
    replica_reports = [json.loads(p.read_text()) for p in reports if p.exists()]
    startups = [json.loads(p.read_text()) for p in ready if p.exists()]
    limit = args.jobs * int((time.time() - started + 10) * 1e6 / every_us(args.every)) * 2
    rows = store_call(url, lambda ops: ops.run_list(namespace, None, limit))
    if not args.keep:
        with contextlib.suppress(Exception):
            store_call(url, lambda ops: ops.run_prune(namespace, 0, 0))
    result = summarise(args, url, namespace, window, rows, replica_reports, procs)
    result["summary"].update(resources(args, window, startups, result["summary"]["runs"]))
    result["meta"]["xact_commit_delta"] = (
        None if xact_before is None or xact_after is None else xact_after - xact_before
    )
    result["meta"]["duration_s"] = round(time.time() - started, 1)
    for path in [*ready, *reports]:
        path.unlink(missing_ok=True)
    for path in tmp.iterdir():
        path.unlink(missing_ok=True)
    tmp.rmdir()
    return result


def summarise(
    args: argparse.Namespace,
    url: str,
    namespace: str,
    window: dict[str, Any],
    rows: list[Any],
    reports: list[dict[str, Any]],
    procs: list[subprocess.Popen[bytes]],
) -> dict[str, Any]:
    step = every_us(args.every)
    lo = int(window["start_us"]) + 1_000_000
    # a slot counts when its fire time (slot + jitter ≤ slot + --jitter) is inside the window
    hi = int(window["end_us"]) - 1_000_000 - every_us(args.jitter)
    first = -(-lo // step) * step
    slot_times = list(range(first, hi + 1, step))
    expected = {(job_name(i), s) for i in range(args.jobs) for s in slot_times}
    in_window = [r for r in rows if lo <= r.slot_us <= hi]
    by_key = {(r.job, r.slot_us): r for r in in_window}
    runs = [r for r in in_window if r.state in CLAIMED]
    states = Counter(r.state for r in in_window)
    never = [k for k in expected if k not in by_key or by_key[k].state not in CLAIMED]
    executed: Counter[tuple[str, int]] = Counter()
    for rep in reports:
        executed.update((job, slot) for job, slot in rep["executed"])
    twice_exec = sum(1 for n in executed.values() if n > 1)
    twice_exec_window = sum(1 for (_j, s), n in executed.items() if n > 1 and lo <= s <= hi)
    retried = sum(1 for r in rows if r.attempt > 1)
    fire = fire_time(args)
    lags_ms = [(r.started_us - fire(r)) / 1e3 for r in runs if r.started_us is not None]
    pid_to_replica = {str(p.pid): i for i, p in enumerate(procs)}
    per_replica: Counter[int] = Counter()
    for r in rows:  # every claimed row, whatever its slot time
        if r.state not in CLAIMED:
            continue
        parts = r.holder.split(":")
        per_replica[pid_to_replica.get(parts[1] if len(parts) > 1 else "", -1)] += 1
    fair = sum(per_replica.values()) / args.replicas
    shares = [per_replica.get(i, 0) for i in range(args.replicas)]
    # store operations and ticks over the window's whole seconds
    s_lo, s_hi = int(window["wall_start"]) + 1, int(window["wall_end"]) - 1
    ticks = ops = 0
    op_names: Counter[str] = Counter()
    total_ops = 0
    for rep in reports:
        ticks += sum(v for k, v in rep["ticks"].items() if s_lo <= int(k) < s_hi)
        for k, counts in rep["ops"].items():
            total_ops += sum(counts.values())
            if s_lo <= int(k) < s_hi:
                ops += sum(counts.values())
                op_names.update(counts)
    seconds = max(1, s_hi - s_lo)
    runs_per_s = len(runs) / max(1e-9, (hi - lo) / 1e6)
    all_runs = [r for r in rows if r.state in CLAIMED]
    all_lags_ms = [(r.started_us - fire(r)) / 1e3 for r in all_runs if r.started_us is not None]
    newest_run = max((r.slot_us for r in all_runs), default=None)
    summary = {
        "all_rows": len(rows),
        "all_states": dict(Counter(r.state for r in rows)),
        "all_runs": len(all_runs),
        "all_lag_ms_p50": percentile(all_lags_ms, 50),
        "all_lag_ms_p99": percentile(all_lags_ms, 99),
        "all_lag_ms_max": max(all_lags_ms) if all_lags_ms else None,
        "newest_slot_run_behind_window_end_s": (
            None if newest_run is None else (window["end_us"] - newest_run) / 1e6
        ),
        "slots": len(expected),
        "runs": len(runs),
        "states": dict(states),
        "slots_run_twice": twice_exec_window,
        "slots_run_twice_any_time": twice_exec,
        "rows_attempt_gt_1": retried,
        "slots_never_run": len(never),
        "never_run_examples": sorted(never)[:5],
        "lag_ms_percentiles": [percentile(lags_ms, q) for q in range(101)] if lags_ms else [],
        "runs_started_per_s": runs_per_second(all_runs, int(window["start_us"])),
        "lag_ms_p50": percentile(lags_ms, 50),
        "lag_ms_p99": percentile(lags_ms, 99),
        "lag_ms_max": max(lags_ms) if lags_ms else None,
        "runs_per_replica": shares,
        "share_min_vs_fair": min(shares) / fair if fair else None,
        "share_max_vs_fair": max(shares) / fair if fair else None,
        "unattributed_runs": per_replica.get(-1, 0),
        "count_seconds": seconds,
        "ticks": ticks,
        "ticks_per_replica_s": ticks / seconds / args.replicas,
        "store_ops": ops,
        "store_ops_per_tick": ops / ticks if ticks else None,
        "store_ops_per_s": ops / seconds,
        "store_ops_by_name": dict(op_names.most_common()),
        "run_claim_per_tick": op_names.get("run_claim", 0) / ticks if ticks else None,
        "runs_per_s": runs_per_s,
        "store_ops_per_run": ops / seconds / runs_per_s if runs_per_s else None,
        "store_ops_replica_lifetime": total_ops,
    }
    return {
        "meta": {
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(window["wall_start"])),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "backend_url": url,
            "namespace": namespace,
            "window_us": [int(window["start_us"]), int(window["end_us"])],
            "measured_slot_range_us": [lo, hi],
            "startup_s": round(window["startup_s"], 1),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "ledger_rows_read": len(rows),
        },
        "summary": summary,
    }


def resources(
    args: argparse.Namespace, window: dict[str, Any], startups: list[dict[str, Any]], runs: int
) -> dict[str, Any]:
    """CPU of the replicas and of the store server over the window, per run; memory per
    replica at the window's end; where start-up time went (slowest replica)."""
    client = window["client_cpu_end"] - window["client_cpu_start"]
    start, end = window["server_cpu_start"], window["server_cpu_end"]
    server = None if start is None or end is None else end - start
    rss = [mb for mb in window["rss_mb"] if mb]
    return {
        "client_cpu_s": client,
        "client_cpu_ms_per_run": 1e3 * client / runs if runs else None,
        "client_cpu_cores": client / args.duration,
        "server_cpu_s": server,
        "server_cpu_ms_per_run": None if server is None or not runs else 1e3 * server / runs,
        "server_cpu_cores": None if server is None else server / args.duration,
        "rss_mb_per_replica_max": max(rss) if rss else None,
        "rss_mb_per_replica_mean": sum(rss) / len(rss) if rss else None,
        "startup_import_s_max": max((s["import_s"] for s in startups), default=None),
        "startup_specs_s_max": max((s["specs_s"] for s in startups), default=None),
        "startup_register_s_max": max((s["register_s"] for s in startups), default=None),
    }


def _fmt(value: Any, spec: str = ",.1f") -> str:
    return "–" if value is None else format(value, spec)


def markdown(result: dict[str, Any]) -> str:
    a, s, m = result["meta"]["args"], result["summary"], result["meta"]
    xact = m.get("xact_commit_delta")
    xact_txt = (
        "n/a (not PostgreSQL)"
        if xact is None
        else f"{xact:,} over the replicas' whole life (fleetcron counted"
        f" {s['store_ops_replica_lifetime']:,} store ops in the same span)"
    )
    other = {k: v for k, v in s["states"].items() if k not in CLAIMED}
    rows = [
        ("backend", a["backend"]),
        ("jobs × replicas, every, concurrency", f"{a['jobs']} × {a['replicas']}, "
         f"{a['every']}, {a['concurrency']}"),
        ("measured window", f"{a['duration']} s (slots from start+1 s to end−1 s)"),
        ("replica start-up (spawn + register)", f"{m['startup_s']} s"),
        ("slots in the window", f"{s['slots']:,}"),
        ("runs (claimed slots)", f"{s['runs']:,}"),
        ("slots run twice (noop executions > 1)", f"{s['slots_run_twice']}"
         f" (any time: {s['slots_run_twice_any_time']}; ledger attempt > 1:"
         f" {s['rows_attempt_gt_1']})"),
        ("slots never run in the window", f"{s['slots_never_run']:,}"),
        ("rows skipped / missed / other", json.dumps(other) if other else "0"),
        ("fire lag in the window: p50 / p99 / max (ms)",
         f"{_fmt(s['lag_ms_p50'])} / {_fmt(s['lag_ms_p99'])}"
         f" / {_fmt(s['lag_ms_max'])}"),
        ("all ledger rows (any slot time): states", json.dumps(s["all_states"])),
        ("fire lag, all runs: p50 / p99 / max (ms)",
         f"{_fmt(s['all_lag_ms_p50'])} / {_fmt(s['all_lag_ms_p99'])}"
         f" / {_fmt(s['all_lag_ms_max'])}"),
        ("newest slot run: behind window end (s)",
         _fmt(s["newest_slot_run_behind_window_end_s"], ".1f")),
        ("runs per replica (all claimed rows)", ", ".join(f"{n:,}" for n in s["runs_per_replica"])),
        ("share min / max vs fair (1/R)", f"{_fmt(s['share_min_vs_fair'], '.2f')} / "
         f"{_fmt(s['share_max_vs_fair'], '.2f')}"),
        ("ticks per replica per second", _fmt(s["ticks_per_replica_s"], ".2f")),
        ("store ops per tick (counted in replicas)", _fmt(s["store_ops_per_tick"], ".2f")),
        ("run_claim per tick", _fmt(s["run_claim_per_tick"], ".2f")),
        ("store ops per second, all replicas", _fmt(s["store_ops_per_s"], ",.0f")),
        ("runs per second, all replicas", _fmt(s["runs_per_s"], ",.0f")),
        ("store ops per run", _fmt(s["store_ops_per_run"], ".2f")),
        ("ops by name (window)", ", ".join(f"{k} {v:,}" for k, v in
                                            s["store_ops_by_name"].items())),
        ("pg_stat_database xact_commit delta", xact_txt),
        ("CPU per run: replicas / store server (ms)",
         f"{_fmt(s.get('client_cpu_ms_per_run'), '.2f')} / "
         f"{_fmt(s.get('server_cpu_ms_per_run'), '.2f')}"),
        ("CPU in the window: replicas / store server (cores)",
         f"{_fmt(s.get('client_cpu_cores'), '.2f')} / {_fmt(s.get('server_cpu_cores'), '.2f')}"),
        ("memory per replica: mean / max (MiB)",
         f"{_fmt(s.get('rss_mb_per_replica_mean'))} / {_fmt(s.get('rss_mb_per_replica_max'))}"),
        ("start-up of the slowest replica: import / job specs / register (s)",
         f"{_fmt(s.get('startup_import_s_max'), '.2f')} / "
         f"{_fmt(s.get('startup_specs_s_max'), '.2f')} / "
         f"{_fmt(s.get('startup_register_s_max'), '.2f')}"),
    ]  # fmt: skip
    lines = ["| measure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--backend", default="postgres", help="postgres | mysql | redis | sqlite | a store URL"
    )
    parser.add_argument("--jobs", "-n", type=int, default=200, help="N jobs")
    parser.add_argument("--replicas", "-r", type=int, default=4, help="R replica processes")
    parser.add_argument("--duration", "-d", type=float, default=20.0, help="D: measured seconds")
    parser.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=16,
        help="C: SchedulerOptions.concurrency per replica",
    )
    parser.add_argument("--every", default="1s", help="each job's `every`")
    parser.add_argument("--overlap", default="skip", help="each job's `overlap`")
    parser.add_argument("--jitter", default="0s", help="each job's `jitter`")
    parser.add_argument("--mode", default="claim", help="claim | leader")
    parser.add_argument("--leader-ttl", default="15s", help="leader lease (mode = leader)")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--keep", action="store_true", help="do not prune the ledger rows")
    parser.add_argument(
        "--shared-database",
        action="store_true",
        help="run in the backend URL's database (default: a fresh one on its server, "
        "dropped after the run; PostgreSQL and MySQL)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    # replica side (internal)
    parser.add_argument(
        "--profile",
        type=Path,
        help="a folder: each replica writes a cProfile of its event loop's CPU time there",
    )
    parser.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    parser.add_argument("--report-file", help=argparse.SUPPRESS)
    return parser.parse_args(argv)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replica:
        if args.profile is None:
            asyncio.run(replica_main(args))
            return 0
        import cProfile

        # The CPU time of the event loop's thread (where the scheduling runs), not the
        # wall clock: on a loaded machine a process waits for a core at every wake-up of
        # the server, which a sampling profiler counts where it happened.
        profile = cProfile.Profile(time.thread_time)
        profile.runcall(asyncio.run, replica_main(args))
        profile.dump_stats(str(Path(args.profile) / f"replica-{os.getpid()}.prof"))
        return 0
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\n(results: {args.out}; {result['meta']['duration_s']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
