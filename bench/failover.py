"""Leader failover benchmark: how long a fleet in leader mode runs nothing after its leader
dies, and what happens to the slots of that gap.

Run from the project root::

    .venv/bin/python bench/failover.py                      # 4 replicas, 2 s lease, 3 kills
    .venv/bin/python bench/failover.py --leader-ttl 15s --kills 2

Method: R replica processes (``bench/scheduler.py --replica --mode leader``) run the same
N jobs (``every`` = 1 s, ``call`` = a no-op) on one store. The parent waits until runs
flow, then K times: reads which replica holds the leader lease (its ``holder`` carries the
process id), sends it SIGKILL, reads the store's clock (the kill time) and waits until
runs flow again and at least ``--settle`` seconds have passed. The killed replica is not
restarted, so R must exceed K. At the end the survivors get SIGTERM and the parent reads
the namespace's ledger:

- **gap**: from the start of the last run the dead leader began to the start of the first
  run its successor began (both the store's clock) — how long the fleet ran nothing;
- **takeover after kill**: from the kill time to the successor's first run start (bounded
  below by what was left of the dead leader's lease, at most its whole ``ttl``);
- the slots due inside the gap and what the ledger says of them (run late, ``missed``
  under the jobs' catch-up policy ``latest``, or no row); ledger rows with ``attempt > 1``.

Results: a markdown table on stdout and ``bench/results/failover.json`` (``--out``).
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
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "failover.json"
SCHEDULER = Path(__file__).resolve().parent / "scheduler.py"
LEADER_LEASE = "fleetcron:leader"


async def _call(url: str, build: Any) -> Any:
    from fleetcron.stores import open_async_store, parse_store_url

    store = await open_async_store(parse_store_url(url))
    try:
        return await store.run(build(store.ops))
    finally:
        await store.close()


def call(url: str, build: Any) -> Any:
    return asyncio.run(_call(url, build))


def leader_pid(url: str, namespace: str) -> int | None:
    record = call(url, lambda ops: ops.lease_get(namespace, LEADER_LEASE))
    if record is None or record.expires_us <= record.now_us:
        return None
    parts = record.holder.split(":")  # host:pid:token:leader
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def newest_start(url: str, namespace: str, limit: int) -> tuple[int, str] | None:
    rows = call(url, lambda ops: ops.run_list(namespace, None, limit))
    started = [(r.started_us, r.holder) for r in rows if r.started_us is not None]
    return max(started) if started else None


def pid_of(holder: str) -> int | None:
    parts = holder.split(":")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.replicas <= args.kills:
        raise SystemExit("--replicas must exceed --kills: killed replicas are not restarted")
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-failover-"))
    url = {"postgres": "postgresql://postgres@127.0.0.1:5432/test",
           "mysql": "mysql://root@127.0.0.1:3306/test",
           "redis": "redis://127.0.0.1:6379/0"}.get(args.backend, args.backend)  # fmt: skip
    if args.backend == "sqlite":
        url = f"sqlite:///{tmp / 'bench.db'}"
    namespace = f"bench-failover-{secrets.token_hex(4)}"
    call(url, lambda ops: ops.store_now())
    procs: dict[int, subprocess.Popen[bytes]] = {}
    kills: list[dict[str, Any]] = []
    started = time.time()
    try:
        for i in range(args.replicas):
            cmd = [
                sys.executable, str(SCHEDULER), "--replica",
                "--url", url, "--namespace", namespace,
                "--jobs", str(args.jobs), "--every", args.every,
                "--overlap", "skip", "--concurrency", str(args.concurrency),
                "--mode", "leader", "--leader-ttl", args.leader_ttl,
                "--ready-file", str(tmp / f"ready-{i}"),
                "--report-file", str(tmp / f"report-{i}.json"),
            ]  # fmt: skip
            proc = subprocess.Popen(cmd, cwd=ROOT)
            procs[proc.pid] = proc
        limit = args.jobs * 10
        give_up = time.time() + 120
        while newest_start(url, namespace, limit) is None:
            if time.time() > give_up:
                raise RuntimeError("no run started within 120 s")
            time.sleep(0.2)
        time.sleep(args.settle)
        for _ in range(args.kills):
            pid = leader_pid(url, namespace)
            if pid is None or pid not in procs:
                raise RuntimeError(f"no live leader to kill (lease holder pid {pid})")
            procs[pid].send_signal(signal.SIGKILL)
            procs[pid].wait()
            kill_us = call(url, lambda ops: ops.store_now())
            kills.append({"pid": pid, "kill_us": kill_us})
            print(f"killed leader {pid}", file=sys.stderr)
            give_up = time.time() + 120
            while True:
                newest = newest_start(url, namespace, limit)
                if newest is not None and newest[0] > kill_us and pid_of(newest[1]) != pid:
                    break
                if time.time() > give_up:
                    raise RuntimeError("no successor ran anything within 120 s")
                time.sleep(0.1)
            time.sleep(args.settle)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    rows = call(url, lambda ops: ops.run_list(namespace, None, 10_000_000))
    if not args.keep:
        with contextlib.suppress(Exception):
            call(url, lambda ops: ops.run_prune(namespace, 0, 0))
    for path in tmp.iterdir():
        path.unlink(missing_ok=True)
    tmp.rmdir()
    return summarise(args, url, namespace, rows, kills, time.time() - started)


def summarise(
    args: argparse.Namespace,
    url: str,
    namespace: str,
    rows: list[Any],
    kills: list[dict[str, Any]],
    elapsed_s: float,
) -> dict[str, Any]:
    runs = sorted((r for r in rows if r.started_us is not None), key=lambda r: r.started_us)
    measured = []
    for kill in kills:
        dead = [r for r in runs if pid_of(r.holder) == kill["pid"]]
        after = [r for r in runs if r.started_us > kill["kill_us"]]
        successor = next((r for r in after if pid_of(r.holder) != kill["pid"]), None)
        if not dead or successor is None:
            continue
        last_dead = dead[-1].started_us
        first_new = successor.started_us
        gap_slots = [r for r in rows if last_dead < r.slot_us < first_new]
        states = Counter(r.state for r in gap_slots)
        measured.append(
            {
                "pid": kill["pid"],
                "gap_s": (first_new - last_dead) / 1e6,
                "takeover_after_kill_s": (first_new - kill["kill_us"]) / 1e6,
                "slots_in_gap_rows": len(gap_slots),
                "slots_in_gap_states": dict(states),
            }
        )
    gaps = [m["gap_s"] for m in measured]
    return {
        "meta": {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "backend_url": url,
            "namespace": namespace,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "elapsed_s": round(elapsed_s, 1),
        },
        "kills": measured,
        "summary": {
            "kills": len(measured),
            "gap_s_min": min(gaps) if gaps else None,
            "gap_s_max": max(gaps) if gaps else None,
            "rows": len(rows),
            "states": dict(Counter(r.state for r in rows)),
            "rows_attempt_gt_1": sum(1 for r in rows if r.attempt > 1),
            "holders": len({pid_of(r.holder) for r in runs}),
        },
    }


def markdown(result: dict[str, Any]) -> str:
    a, s = result["meta"]["args"], result["summary"]
    lines = [
        f"{a['backend']}, {a['replicas']} replicas in leader mode, {a['jobs']} jobs every"
        f" {a['every']}, leader lease {a['leader_ttl']}, {s['kills']} leaders killed (SIGKILL)",
        "",
        "| kill | gap: last run of the dead leader → first run of its successor (s) |"
        " takeover after the kill (s) | slots due in the gap: ledger states |",
        "|---|---|---|---|",
    ]
    for n, kill in enumerate(result["kills"], 1):
        lines.append(
            f"| {n} | {kill['gap_s']:.2f} | {kill['takeover_after_kill_s']:.2f} |"
            f" {json.dumps(kill['slots_in_gap_states'])} |"
        )
    lines += [
        "",
        f"All ledger rows: {json.dumps(s['states'])}; rows with attempt > 1:"
        f" {s['rows_attempt_gt_1']}; replicas that ran something: {s['holders']}.",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backend", default="postgres", help="postgres | mysql | redis | URL")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--every", default="1s")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--leader-ttl", default="2s")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds between events")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
