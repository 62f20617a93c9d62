"""Start-up and idle cost of one replica with many jobs, none of them due during the run.

Run from the project root::

    .venv/bin/python -m bench.startup_idle                       # 10,000 jobs, every + cron, SQLite
    .venv/bin/python -m bench.startup_idle --backend sqlite --backend postgres --repeat 3 \\
        --out bench/results/startup-idle.json
    .venv/bin/python -m bench.startup_idle --kind cron --jobs 1000 --idle 30

Method: for each backend, kind of schedule and repetition, a jobs file of ``--jobs`` jobs
is written (``command = ["true"]``) with

- ``every``: ``every = "1d"`` (slots at 00:00 UTC; the run refuses to start when midnight
  UTC falls inside it), or
- ``cron``: daily cron schedules spread over the day, ``"M H * * *"`` with ``(H, M)``
  taken in turn from the minutes of the day that lie outside the run (from 2 minutes
  before the start to ``--avoid`` minutes after it), so many jobs share an expression as
  they would in a real file;

and ``fleetcron run JOBS.toml`` is started as a user would start it, on a fresh store
(a new SQLite file; a new database on the PostgreSQL server, dropped at the end). The
parent polls the store's replica table every 20 ms: the replica's heartbeat row appears
once it has registered and planned every job, just before it starts scheduling — that is
*ready*. Measured from the process's ``/proc/<pid>/stat`` (user + system, the replica and
every process it started, e.g. its reaper):

- **CPU to ready** (s) and wall time to ready (s), from the process's start;
- **idle** (cores): CPU seconds over ``--idle`` seconds, starting ``--settle`` seconds
  after ready (the first watch of the monitor, at start, is outside the window; with the
  default 15 s monitor period a 60 s window holds four watches), divided by the window;
- on PostgreSQL the server's CPU over the same window (every process of the postmaster);
- **restart**: the replica is stopped (SIGTERM) and started again on the same store, the
  definitions unchanged: CPU and wall time to ready again.

The replica's log goes to ``<tmp>/replica-*.log``; its lines that say how start-up went
are printed after each run. Results: a markdown table on stdout and JSON (``--out``).
Each figure is a range over ``--repeat`` runs.
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
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "src")]

from scheduler import _children, fresh_database, proc_cpu_s, server_cpu_s  # noqa: E402

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
"""The server a fresh database is made on for each run (and dropped after it): the
database named here is only connected to, to create and drop that one."""


def cron_minutes(now: datetime, avoid_min: int) -> list[tuple[int, int]]:
    """The (hour, minute) pairs of a day outside [now - 2 min, now + avoid_min]."""
    start = now - timedelta(minutes=2)
    skip = set()
    for step in range(avoid_min + 3):
        moment = start + timedelta(minutes=step)
        skip.add((moment.hour, moment.minute))
    return [(h, m) for h in range(24) for m in range(60) if (h, m) not in skip]


def jobs_toml(kind: str, jobs: int, namespace: str, url: str, avoid_min: int) -> str:
    """The jobs file of one run."""
    lines = ["[fleetcron]", f"namespace = {json.dumps(namespace)}", f"backend = {json.dumps(url)}"]
    minutes = cron_minutes(datetime.now(UTC), avoid_min) if kind == "cron" else []
    for i in range(jobs):
        lines.append(f"\n[jobs.job-{i:05d}]")
        if kind == "every":
            lines.append('every = "1d"')
        else:
            hour, minute = minutes[(i * 7919) % len(minutes)]  # spread, and repeated
            lines.append(f'schedule = "{minute} {hour} * * *"')
        lines.append('command = ["true"]')
    return "\n".join(lines) + "\n"


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += proc_cpu_s(current)
        stack.extend(_children(current))
    return total


def _replica_up(store: Any, namespace: str, pid: int) -> bool:
    from fleetcron.models import REPLICA_RETAIN_US

    rows = store.run(store.ops.replica_list(namespace, REPLICA_RETAIN_US))
    return any(row.pid == pid and row.alive for row in rows)


def start_replica(
    jobs_file: Path, log_path: Path, store: Any, namespace: str, timeout_s: float
) -> tuple[subprocess.Popen[bytes], float, float]:
    """Start ``fleetcron run``; wait until its heartbeat row is up. Returns the process,
    its CPU seconds and the wall seconds to that moment."""
    began = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from fleetcron.cli.main import entry; entry()",
                "run",
                str(jobs_file),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=jobs_file.parent,
        )
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the replica exited with {proc.returncode}: see {log_path}")
        if _replica_up(store, namespace, proc.pid):
            return proc, tree_cpu_s(proc.pid), time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            proc.kill()
            raise RuntimeError(f"the replica was not ready after {timeout_s} s: see {log_path}")
        time.sleep(0.02)


def stop_replica(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _store(url: str) -> Iterator[Any]:
    from fleetcron.stores import open_store, parse_store_url

    store = open_store(parse_store_url(url))
    try:
        yield store
    finally:
        store.close()


def one_run(args: argparse.Namespace, backend: str, kind: str, tmp: Path) -> dict[str, Any]:
    """One replica started on a fresh store, idle, stopped, and started again."""
    if kind == "every":
        now = datetime.now(UTC)
        midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        if (midnight - now).total_seconds() < args.avoid * 60:
            raise SystemExit("midnight UTC falls inside the run: the every = 1d jobs would fire")
    base = POSTGRES if backend == "postgres" else backend
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp / f'{kind}-{secrets.token_hex(3)}.db'}"
        else:
            url = stack.enter_context(fresh_database(base, True))
        namespace = f"bench-idle-{secrets.token_hex(3)}"
        jobs_file = tmp / f"jobs-{kind}.toml"
        jobs_file.write_text(jobs_toml(kind, args.jobs, namespace, url, args.avoid))
        store = stack.enter_context(_store(url))
        store.run(store.ops.store_now())  # the schema, before the replica starts
        log_path = tmp / f"replica-{kind}-{namespace}.log"
        server = url if url.startswith("postgres") else None

        proc, ready_cpu, ready_wall = start_replica(
            jobs_file, log_path, store, namespace, args.timeout
        )
        try:
            time.sleep(args.settle)
            cpu0 = tree_cpu_s(proc.pid)
            server0 = server_cpu_s(server) if server else None
            t0 = time.monotonic()
            time.sleep(args.idle)
            cpu1 = tree_cpu_s(proc.pid)
            server1 = server_cpu_s(server) if server else None
            window = time.monotonic() - t0
        finally:
            stop_replica(proc)
        again, again_cpu, again_wall = start_replica(
            jobs_file, log_path, store, namespace, args.timeout
        )
        stop_replica(again)
    result = {
        "backend": backend,
        "kind": kind,
        "jobs": args.jobs,
        "ready_cpu_s": round(ready_cpu, 3),
        "ready_wall_s": round(ready_wall, 3),
        "idle_window_s": round(window, 1),
        "idle_cores": round((cpu1 - cpu0) / window, 4),
        "idle_server_cores": (
            round((server1 - server0) / window, 4)
            if server0 is not None and server1 is not None
            else None
        ),
        "restart_cpu_s": round(again_cpu, 3),
        "restart_wall_s": round(again_wall, 3),
        "log": [
            line
            for line in log_path.read_text().splitlines()
            if "job(s)" in line  # read, registered, and the start-up line
        ],
    }
    print(json.dumps(result), file=sys.stderr)
    return result


def _span(values: list[float], spec: str) -> str:
    low, high = min(values), max(values)
    return f"{low:{spec}}" if f"{low:{spec}}" == f"{high:{spec}}" else f"{low:{spec}}–{high:{spec}}"


def markdown(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| backend | schedules | CPU to ready (s) | wall to ready (s) | idle (cores) "
        "| server idle (cores) | restart: CPU to ready (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["backend"], run["kind"]), []).append(run)
    for (backend, kind), group in groups.items():
        server = [r["idle_server_cores"] for r in group if r["idle_server_cores"] is not None]
        rows.append(
            f"| {backend} | {kind} | {_span([r['ready_cpu_s'] for r in group], '.2f')} "
            f"| {_span([r['ready_wall_s'] for r in group], '.2f')} "
            f"| {_span([r['idle_cores'] for r in group], '.3f')} "
            f"| {_span(server, '.3f') if server else '–'} "
            f"| {_span([r['restart_cpu_s'] for r in group], '.2f')} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--kind", action="append", choices=("every", "cron"))
    parser.add_argument(
        "--backend",
        action="append",
        help="sqlite, postgres, or a PostgreSQL URL (default: sqlite)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--idle", type=float, default=60.0, help="idle window, seconds")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after ready first")
    parser.add_argument("--avoid", type=int, default=20, help="cron: minutes kept free")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.kind = args.kind or ["every", "cron"]
    args.backend = args.backend or ["sqlite"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-idle-"))
    runs = [
        one_run(args, backend, kind, tmp)
        for _ in range(args.repeat)
        for backend in args.backend
        for kind in args.kind
    ]
    print(markdown(runs))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "when": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                    "settings": {k: str(v) for k, v in vars(args).items()},
                    "runs": runs,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
