"""fleetcron on deployments built for failover, beside one server: the lock cycle and the
scheduler through a PostgreSQL primary with a synchronous standby and with an asynchronous
one, and on a 3-member etcd cluster; how long a fleet on etcd waits when its leader dies.

Run from the project root::

    .venv/bin/python bench/ha.py                       # about 6 minutes
    .venv/bin/python bench/ha.py --cycles 300 --rounds 3 --scheduler 200x4   # smoke run

Method: three deployments of PostgreSQL 15 of the bench's own (temporary directories,
spare loopback ports, ``fsync`` on, the servers of the fault suite: tests/fault/servers.py
and tests/fault/pg_pair.py), all on this machine:

- ``single``: one server;
- ``sync``: a primary and a streaming standby named in ``synchronous_standby_names``
  (``FIRST 1``, ``synchronous_commit = on``): every commit waits for the standby's flush;
- ``async``: the same pair without ``synchronous_standby_names``;
- ``etcd``: three etcd 3.4 members (tests/etcd_server.py: data under ``/dev/shm``,
  heartbeat 50 ms, election timeout 500 ms), reached as ``etcd://m1,m2,m3/bench``.

fleetcron reaches a pair through its multi-host URL (``h1:p1,h2:p2``, which connects to the
writable server). **Lock cycle** (acquire + release, ``Fleet.try_lock`` without keepalive):
``--cycles`` timed cycles per deployment in ``--rounds`` interleaved rounds, each round in
a fresh random order, wall time per cycle. **Scheduler**: ``bench/scheduler.py`` per
deployment and size (``--scheduler 200x4,1000x8``: jobs × replicas, every job every
second), one after the other; its summary's runs, slots run twice or never, and lag of a
run's start behind its slot. Standby and primary (or the three members) share the machine's
two cores, so replication competes with the clients: these are figures of one box, not of
a network.

**Leader loss** (etcd, ``--leader-kills``): a client takes and releases a lock of a new
name, one cycle after another, on a cluster of its own; the leader is SIGKILLed while it
does; the time from the kill to the first cycle that completes after it is the fleet's wait
(a cycle in flight at the kill fails or waits for the new leader), then the member is
restarted and the cluster left to settle before the next kill.

Results: a markdown table on stdout and ``bench/results/ha.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from etcd_server import EtcdCluster  # noqa: E402
from fault.pg_pair import PostgresPair  # noqa: E402
from fault.servers import PostgresCluster  # noqa: E402
from locks import fleetcron_runner  # noqa: E402  (bench/, this script's folder)

RESULTS = ROOT / "bench" / "results" / "ha.json"
DEPLOYMENTS = ("single", "sync", "async", "etcd")


@contextlib.contextmanager
def deployment(kind: str, tmp: Path) -> Iterator[str]:
    """The fleetcron URL of a running deployment of ``kind``, stopped on exit."""
    if kind == "etcd":
        cluster = EtcdCluster(3)
        try:
            yield cluster.url + "/bench"
        finally:
            cluster.close()
        return
    if kind == "single":
        server = PostgresCluster(tmp / kind)
        try:
            yield f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        finally:
            server.close()
        return
    pair = PostgresPair(tmp / kind, synchronous=kind == "sync")
    try:
        assert pair.standby is not None
        yield (
            f"postgresql://postgres@127.0.0.1:{pair.primary.port},"
            f"127.0.0.1:{pair.standby.port}/postgres"
        )
    finally:
        pair.close()


def lock_cycles(urls: dict[str, str], cycles: int, rounds: int) -> dict[str, dict[str, float]]:
    """Wall time of a lock cycle per deployment, interleaved rounds (see the docstring)."""
    # bench/locks.py's fleetcron subject: try_lock without keepalive, then release.
    runners = {kind: fleetcron_runner(url, f"ha-{kind}") for kind, url in urls.items()}
    times: dict[str, list[float]] = {kind: [] for kind in urls}
    try:
        for runner in runners.values():  # warm-up: connect, prepare
            for _ in range(50):
                runner.cycle()
        per_round = max(1, cycles // rounds)
        for _ in range(rounds):
            order = list(runners)
            random.shuffle(order)
            for kind in order:
                cycle = runners[kind].cycle
                for _ in range(3):  # the first call after switching is slow on a small VM
                    cycle()
                gc.disable()
                try:
                    for _ in range(per_round):
                        start = time.perf_counter()
                        cycle()
                        times[kind].append(time.perf_counter() - start)
                finally:
                    gc.enable()
    finally:
        for runner in runners.values():
            runner.close()
    result = {}
    for kind, samples in times.items():
        ordered = sorted(samples)
        result[kind] = {
            "cycles": len(ordered),
            "p50_ms": statistics.median(ordered) * 1e3,
            "p99_ms": ordered[int(len(ordered) * 0.99) - 1] * 1e3,
            "mean_ms": statistics.fmean(ordered) * 1e3,
        }
    return result


def leader_loss(kills: int) -> dict[str, Any]:
    """Seconds from each SIGKILL of the etcd leader to the first lock cycle completed after
    it, on a cluster of its own (see the docstring)."""
    from fleetcron import Fleet
    from fleetcron.errors import StoreError

    waits: list[float] = []
    failed = 0
    with EtcdCluster(3) as cluster:
        fleet = Fleet(cluster.url + "/bench", namespace="bench-leader-loss")
        done = threading.Event()
        completed: list[float] = []
        errors: list[float] = []

        def cycles() -> None:
            index = 0
            while not done.is_set():
                index += 1
                try:
                    lease = fleet.try_lock(f"loss-{index}", lock_at_most="30s", keepalive=False)
                    if lease is not None:
                        lease.release()
                    completed.append(time.monotonic())
                except StoreError:
                    errors.append(time.monotonic())

        worker = threading.Thread(target=cycles, name="cycles")
        worker.start()
        try:
            for _ in range(kills):
                time.sleep(1.0)  # cycles before the kill: part of the method, not a wait
                leader = cluster.leader()
                cluster.kill9(leader)
                killed = time.monotonic()
                give_up = killed + 60
                while not any(t > killed for t in completed[-50:]):
                    if time.monotonic() > give_up:
                        raise RuntimeError("no lock cycle completed within 60 s of the kill")
                    time.sleep(0.001)  # polling the worker's list, bounded above
                waits.append(min(t for t in completed[-50:] if t > killed) - killed)
                cluster.heal()
        finally:
            done.set()
            worker.join(60)
            fleet.close()
        failed = len(errors)
    return {
        "kills": len(waits),
        "waits_s": [round(w, 3) for w in waits],
        "median_s": statistics.median(waits) if waits else None,
        "max_s": max(waits) if waits else None,
        "cycles_failed": failed,
    }


def scheduler(url: str, jobs: int, replicas: int, duration: float, tmp: Path) -> dict[str, Any]:
    """One run of bench/scheduler.py on ``url``: its summary's headline figures."""
    out = tmp / f"scheduler-{jobs}x{replicas}-{time.monotonic_ns()}.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scheduler.py"),
            "--backend",
            url,
            "--jobs",
            str(jobs),
            "--replicas",
            str(replicas),
            "--duration",
            str(duration),
            "--out",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    summary = json.loads(out.read_text())["summary"]
    keys = (
        "slots",
        "runs",
        "slots_run_twice",
        "slots_never_run",
        "rows_attempt_gt_1",
        "all_lag_ms_p50",
        "all_lag_ms_p99",
        "states",
    )
    return {key: summary.get(key) for key in keys}


def _table(results: dict[str, Any]) -> str:
    lines = [
        "| deployment | lock cycle p50 (ms) | p99 (ms) | × one server |",
        "|---|---|---|---|",
    ]
    locks = results["lock_cycle"]
    base = (locks.get("single") or next(iter(locks.values())))["p50_ms"]
    for kind in DEPLOYMENTS:
        row = locks.get(kind)
        if row:
            lines.append(
                f"| {kind} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                f"{row['p50_ms'] / base:.2f} |"
            )
    lines += [
        "",
        "| deployment | jobs × replicas | slots | runs | run twice | never run (their states) "
        "| lag p50 (ms) | lag p99 (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["scheduler"]:
        s = row["summary"]
        lines.append(
            f"| {row['deployment']} | {row['size']} | {s['slots']} | {s['runs']} | "
            f"{s['slots_run_twice']} | {s['slots_never_run']}{_not_run(s)} | "
            f"{s['all_lag_ms_p50']:.0f} | "
            f"{s['all_lag_ms_p99']:.0f} |"
        )
    loss = results.get("leader_loss")
    if loss:
        waits = ", ".join(f"{w:.2f}" for w in loss["waits_s"])
        lines += [
            "",
            f"etcd leader SIGKILLed {loss['kills']} times: first lock cycle after "
            f"{waits} s (median {loss['median_s']:.2f} s, max {loss['max_s']:.2f} s); "
            f"{loss['cycles_failed']} cycles failed",
        ]
    return "\n".join(lines)


def _not_run(summary: dict[str, Any]) -> str:
    """The states of the slots that did not run (missed, skipped…), as `` (missed 12)``."""
    states = {k: v for k, v in (summary.get("states") or {}).items() if k != "succeeded"}
    return f" ({', '.join(f'{k} {v}' for k, v in sorted(states.items()))})" if states else ""


def _sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in filter(None, text.split(",")):
        jobs, _, replicas = part.partition("x")
        sizes.append((int(jobs), int(replicas)))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=3000, help="timed lock cycles per deployment")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds")
    parser.add_argument(
        "--scheduler", default="200x4,1000x8", help="jobs×replicas, comma-separated"
    )
    parser.add_argument("--duration", type=float, default=20.0, help="scheduler's measured seconds")
    parser.add_argument("--only", default=",".join(DEPLOYMENTS), help="deployments to run")
    parser.add_argument("--leader-kills", type=int, default=5, help="etcd leader SIGKILLs")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    kinds = [kind for kind in DEPLOYMENTS if kind in args.only.split(",")]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results: dict[str, Any] = {"lock_cycle": {}, "scheduler": []}
    with tempfile.TemporaryDirectory(prefix="fleetcron-bench-ha-") as name:
        tmp = Path(name)
        with contextlib.ExitStack() as stack:
            urls = {kind: stack.enter_context(deployment(kind, tmp)) for kind in kinds}
            results["lock_cycle"] = lock_cycles(urls, args.cycles, args.rounds)
            for jobs, replicas in _sizes(args.scheduler):
                for kind in kinds:
                    summary = scheduler(urls[kind], jobs, replicas, args.duration, tmp)
                    results["scheduler"].append(
                        {"deployment": kind, "size": f"{jobs}×{replicas}", "summary": summary}
                    )
        if "etcd" in kinds and args.leader_kills:
            results["leader_loss"] = leader_loss(args.leader_kills)
    results["meta"] = {
        "started_utc": started,
        "args": {k: str(v) for k, v in vars(args).items()},
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
