"""Memory, CPU and start-up time of one ``fleetcron run`` replica holding many jobs.

Run from the project root::

    .venv/bin/python bench/memory_jobs.py                          # 100,000 jobs, every 5m, SQLite
    .venv/bin/python bench/memory_jobs.py --kind cron --backend postgres --runs 3
    .venv/bin/python bench/memory_jobs.py --sweep 1000,10000,30000,100000 \
        --plot docs/img/memory_jobs.png                            # memory against jobs
    .venv/bin/python bench/memory_jobs.py --trace --jobs 100000    # where the memory goes

Method: the parent writes a jobs file of ``--jobs`` jobs, each with a command of its own
(``/bin/echo <name> …``), and either ``every = "5m"`` (``--kind every``) or a daily cron
line, ``M H * * *``, spread over the day's minutes and four time zones (``--kind cron``).
It starts ``fleetcron run`` on it — the console script, as a user would — in a fresh
store: a new SQLite file, or a new PostgreSQL database on the server of ``--pg-url``,
dropped at the end. Every second it reads the process's ``VmRSS`` and ``VmHWM``
(``/proc/PID/status``) and its user + system CPU (``/proc/PID/stat``); every 0.2 s until
it appears it reads the namespace's replica table: a replica writes its row once it has
registered and planned every job, so the row's appearance is *ready* (time from the
process's start). After ``--duration`` seconds it sends SIGTERM and waits for the exit.

With ``--kind every`` the replica is started just after a 5-minute boundary (``--align``,
the default), so that no slot falls due while it is measured: the figures are those of a
replica holding its jobs, not of one running 100,000 commands at once. Daily cron lines
spread over the day's minutes bring about 70 slots a minute, which run.

``--restart`` measures a restart, as after a deploy: a first replica registers the jobs
and stops once ready, then the measured one starts on a store that holds every definition.

``--trace`` runs the replica inside this script under ``tracemalloc`` (one frame) and
writes, every ``--trace-every`` seconds, the traced total, ``VmRSS`` and the 25 source
lines holding the most memory to ``<out>.trace.jsonl``: slower (about 2×), but it says
where the memory is.

Results: a markdown table on stdout and ``bench/results/memory_jobs.json`` (``--out``):
per run the samples, the peak (``VmHWM``), the RSS at the end, the CPU at 90 s and at the
end, and the time to ready. ``--plot`` draws peak and final RSS against the number of
jobs from the runs of a ``--sweep`` (needs matplotlib, the ``bench`` extra).
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "memory_jobs.json"
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo")
ALIGN_US = 300_000_000  # every = "5m": slots at each 5-minute boundary of the epoch


# -- the jobs file ---------------------------------------------------------------------------


def job_name(i: int) -> str:
    return f"report-{i:06d}"


def jobs_file(path: Path, count: int, kind: str, url: str, namespace: str) -> None:
    """Write a jobs file of ``count`` jobs of ``kind`` (every | cron) on ``url``."""
    lines = [
        "[fleetcron]",
        f'namespace = "{namespace}"',
        f'backend = "{url}"',
        "",
    ]
    for i in range(count):
        name = job_name(i)
        lines.append(f'[jobs."{name}"]')
        if kind == "every":
            lines.append('every = "5m"')
        else:
            minute = i % 1440
            lines.append(f'schedule = "{minute % 60} {minute // 60} * * *"')
            lines.append(f'timezone = "{ZONES[i % len(ZONES)]}"')
        lines.append(f'command = ["/bin/echo", "{name}", "--shard", "{i % 97}"]')
        lines.append(f'lock_at_most = "{(i % 5 + 1) * 10}m"')
        lines.append("")
    path.write_text("\n".join(lines))


# -- the replica's process ----------------------------------------------------------------


def proc_status(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of one process, MiB (empty once it is gone)."""
    found: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(line.split()[1]) / 1024
    except OSError:
        return {}
    return found


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (``None`` once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replica_up(url: str, namespace: str) -> bool:
    """Whether a replica of ``namespace`` has written its row (it has registered its jobs).

    A plain read of the replica table, not a store operation: on SQLite every operation is
    a ``BEGIN IMMEDIATE`` transaction, which would queue the replica's own writes behind
    the watcher's."""
    sql = "SELECT count(*) FROM fleetcron_replica WHERE namespace = "
    try:
        if url.startswith("sqlite://"):
            import sqlite3

            path = url.removeprefix("sqlite://")
            if not Path(path).exists():
                return False
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
                row = conn.execute(sql + "?", (namespace,)).fetchone()
        else:
            import psycopg

            with psycopg.connect(url, autocommit=True) as pg:
                row = pg.execute(sql + "%s", (namespace,)).fetchone()
    except Exception:
        return False  # no schema yet
    return bool(row and row[0])


# -- a store per run -----------------------------------------------------------------------


def _pg_sql(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


@contextlib.contextmanager
def fresh_store(backend: str, tmp: Path, pg_url: str) -> Iterator[str]:
    """A new SQLite file, or a new PostgreSQL database on ``pg_url``'s server, dropped after."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'jobs.db'}"
        return
    database = f"bigfleet_{secrets.token_hex(4)}"
    _pg_sql(pg_url, f'CREATE DATABASE "{database}"')
    try:
        parts = urllib.parse.urlsplit(pg_url)
        yield urllib.parse.urlunsplit(parts._replace(path="/" + database))
    finally:
        with contextlib.suppress(Exception):
            _pg_sql(pg_url, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def wait_for_boundary(margin_s: float, needed_s: float) -> None:
    """Sleep until ``margin_s`` after a 5-minute boundary when fewer than ``needed_s``
    seconds are left before the next one."""
    now_us = time.time_ns() // 1000
    into = now_us % ALIGN_US
    if into >= margin_s * 1e6 and ALIGN_US - into >= needed_s * 1e6:
        return
    wait_us = (
        (ALIGN_US - into + margin_s * 1e6) if into >= margin_s * 1e6 else margin_s * 1e6 - into
    )
    print(f"waiting {wait_us / 1e6:.0f} s for a 5-minute boundary", file=sys.stderr)
    time.sleep(wait_us / 1e6)


def one_run(args: argparse.Namespace, jobs: int, kind: str, backend: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-memory-"))
    namespace = f"mem-{secrets.token_hex(3)}"
    try:
        with fresh_store(backend, tmp, args.pg_url) as url:
            path = tmp / "jobs.toml"
            jobs_file(path, jobs, kind, url, namespace)
            if args.restart:
                register_first(path, url, namespace, tmp)
            if kind == "every" and args.align:
                wait_for_boundary(3.0, args.duration + 60)
            result = measure(args, path, url, namespace, jobs, kind, backend, tmp)
            result["restart"] = args.restart
            return result
    finally:
        for child in tmp.iterdir():
            child.unlink(missing_ok=True)
        tmp.rmdir()


def register_first(path: Path, url: str, namespace: str, tmp: Path) -> None:
    """Run a replica until it is ready, then stop it: the store holds every definition,
    as after a deploy, and the measured replica is a restart."""
    print("a first replica registers the jobs", file=sys.stderr)
    with (tmp / "first.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "fleetcron"), "run", str(path)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while not replica_up(url, namespace):
                if proc.poll() is not None:
                    raise RuntimeError("the first replica exited before it was ready")
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    while replica_up(url, namespace):  # its row goes when it stops cleanly
        time.sleep(0.2)


def measure(
    args: argparse.Namespace,
    path: Path,
    url: str,
    namespace: str,
    jobs: int,
    kind: str,
    backend: str,
    tmp: Path,
) -> dict[str, Any]:
    log_path = tmp / "replica.log"
    trace_path = args.out.with_suffix(f".{kind}-{backend}-{jobs}.trace.jsonl")
    if args.trace:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-trace", str(trace_path)]
        cmd += ["--trace-every", str(args.trace_every), "--", "run", str(path)]
    else:
        cmd = [str(Path(sys.executable).parent / "fleetcron"), "run", str(path)]
    print(f"{jobs:,} jobs, {kind}, {backend}: measuring {args.duration:.0f} s", file=sys.stderr)
    samples: list[dict[str, float]] = []
    ready_s: float | None = None
    with log_path.open("wb") as log:
        began = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def watch_ready() -> None:
            nonlocal ready_s
            while not stop.is_set() and proc.poll() is None:
                if replica_up(url, namespace):
                    ready_s = time.monotonic() - began
                    return
                stop.wait(0.2)

        watcher = threading.Thread(target=watch_ready, daemon=True)
        watcher.start()
        try:
            next_at = began
            while time.monotonic() - began < args.duration:
                if proc.poll() is not None:
                    raise RuntimeError(f"the replica exited early:\n{log_path.read_text()[-2000:]}")
                status, cpu = proc_status(proc.pid), proc_cpu_s(proc.pid)
                samples.append(
                    {
                        "t": round(time.monotonic() - began, 2),
                        "rss_mb": round(status.get("VmRSS", 0.0), 1),
                        "hwm_mb": round(status.get("VmHWM", 0.0), 1),
                        "cpu_s": round(cpu or 0.0, 2),
                    }
                )
                next_at += 1.0
                time.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            stop.set()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            watcher.join(timeout=5)
    text = log_path.read_text(errors="replace")
    at_90 = [s["cpu_s"] for s in samples if s["t"] <= 90.5]
    return {
        "jobs": jobs,
        "kind": kind,
        "backend": backend,
        "ready_s": None if ready_s is None else round(ready_s, 2),
        "peak_mb": max(s["hwm_mb"] for s in samples),
        "end_rss_mb": samples[-1]["rss_mb"],
        "cpu_90_s": at_90[-1] if at_90 else None,
        "cpu_end_s": samples[-1]["cpu_s"],
        "exit": proc.returncode,
        "log_lines": text.count("\n"),
        "log_tail": text.splitlines()[-5:],
        "samples": samples,
        "trace": str(trace_path) if args.trace else None,
    }


# -- the traced replica (--trace) ----------------------------------------------------------


def child_trace(out: Path, every_s: float, argv: list[str]) -> int:
    """Run ``fleetcron`` with ``argv`` in this process under tracemalloc, writing the
    biggest holders of memory every ``every_s`` to ``out`` (JSON lines)."""
    import tracemalloc

    tracemalloc.start(1)
    began = time.monotonic()
    stop = threading.Event()

    def sample() -> None:
        with out.open("w") as f:
            while not stop.wait(every_s):
                snapshot = tracemalloc.take_snapshot()
                current, peak = tracemalloc.get_traced_memory()
                top = snapshot.statistics("lineno")[:25]
                f.write(
                    json.dumps(
                        {
                            "t": round(time.monotonic() - began, 1),
                            "traced_mb": round(current / 2**20, 1),
                            "traced_peak_mb": round(peak / 2**20, 1),
                            "rss_mb": proc_status(os.getpid()).get("VmRSS"),
                            "top": [
                                [str(stat.traceback[0]), round(stat.size / 2**20, 2), stat.count]
                                for stat in top
                            ],
                        }
                    )
                    + "\n"
                )
                f.flush()

    threading.Thread(target=sample, daemon=True).start()
    from fleetcron.cli.main import main as fleetcron_main

    try:
        return fleetcron_main(argv)
    finally:
        stop.set()


# -- the report ------------------------------------------------------------------------------


def _range(values: list[float | None], spec: str) -> str:
    seen = [v for v in values if v is not None]
    if not seen:
        return "–"
    low, high = min(seen), max(seen)
    return f"{low:{spec}}" if low == high else f"{low:{spec}}–{high:{spec}}"


def markdown(runs: list[dict[str, Any]]) -> str:
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        kind = run["kind"] + (" (restart)" if run.get("restart") else "")
        groups.setdefault((run["jobs"], kind, run["backend"]), []).append(run)
    lines = [
        "| jobs | kind | store | runs | peak RSS (VmHWM) | RSS at the end | ready after "
        "| CPU at 90 s | CPU at the end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (jobs, kind, backend), group in sorted(groups.items()):
        lines.append(
            f"| {jobs:,} | {kind} | {backend} | {len(group)} "
            f"| {_range([r['peak_mb'] for r in group], '.0f')} MB "
            f"| {_range([r['end_rss_mb'] for r in group], '.0f')} MB "
            f"| {_range([r['ready_s'] for r in group], '.1f')} s "
            f"| {_range([r['cpu_90_s'] for r in group], '.1f')} s "
            f"| {_range([r['cpu_end_s'] for r in group], '.1f')} s |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    """Peak and final RSS against the number of jobs, one line per kind and store."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    series: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = {}
    for run in runs:
        series.setdefault((run["kind"], run["backend"]), {}).setdefault(run["jobs"], []).append(run)
    for (kind, backend), by_jobs in sorted(series.items()):
        xs = sorted(by_jobs)
        for key, style in (("peak_mb", "-o"), ("end_rss_mb", ":s")):
            ys = [max(r[key] for r in by_jobs[x]) for x in xs]
            what = "peak" if key == "peak_mb" else "after the window"
            ax.plot(xs, ys, style, label=f"{kind}, {backend}: {what}", markersize=4)
    ax.axhline(150, color="#999999", linestyle="--", linewidth=1, label="target: 150 MB")
    ax.set_xscale("log")
    ax.set_xlabel("jobs in the jobs file")
    ax.set_ylabel("resident memory of the replica, MB")
    ax.set_title("One fleetcron run replica: memory against jobs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", "-n", type=int, default=100_000, help="jobs in the file")
    parser.add_argument(
        "--sweep", help="comma-separated job counts (e.g. 1000,10000,30000,100000) instead of -n"
    )
    parser.add_argument("--kind", default="every", help="every | cron | every,cron")
    parser.add_argument("--backend", default="sqlite", help="sqlite | postgres | sqlite,postgres")
    parser.add_argument(
        "--pg-url", default=PG_URL, help="a PostgreSQL server: each run has a database of its own"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each combination")
    parser.add_argument("--duration", "-d", type=float, default=120.0, help="measured seconds")
    parser.add_argument(
        "--no-align",
        dest="align",
        action="store_false",
        help="start at once, even when a slot of `every` may fall due in the window",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="measure a restart: a first replica registers the jobs, then stops",
    )
    parser.add_argument("--trace", action="store_true", help="attribute memory (tracemalloc)")
    parser.add_argument("--trace-every", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--plot", type=Path, help="draw memory against jobs into this PNG")
    parser.add_argument(
        "--plot-only", action="store_true", help="only draw --plot from the runs in --out"
    )
    parser.add_argument("--child-trace", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_trace is not None:
        return child_trace(args.child_trace, args.trace_every, args.rest)
    if args.plot_only:
        plot(json.loads(args.out.read_text())["runs"], args.plot)
        return 0
    counts = [int(c) for c in args.sweep.split(",")] if args.sweep else [args.jobs]
    runs = []
    # Round after round, each kind in turn: a cron run fills the wait of the next `every`
    # run for its 5-minute boundary.
    for _ in range(args.runs):
        for jobs in counts:
            for backend in args.backend.split(","):
                for kind in args.kind.split(","):
                    run = one_run(args, jobs, kind, backend)
                    print(markdown([run]).splitlines()[-1], file=sys.stderr)
                    runs.append(run)
    result = {
        "meta": {
            "args": {k: str(v) for k, v in vars(args).items()},
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(runs))
    if args.plot is not None:
        plot(runs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
