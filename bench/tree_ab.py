"""The lock cycle of two source trees side by side: client CPU and wall time per cycle.

Run from the project root, with the tree to compare unpacked somewhere::

    git archive 1bb95ee | tar -x -C /tmp/before
    .venv/bin/python bench/tree_ab.py --before /tmp/before/src --after src \\
        --url 'sqlite:////tmp/ab-{tree}.db' --pairs 10
    .venv/bin/python bench/tree_ab.py --before /tmp/before/src --after src \\
        --url 'postgresql://postgres@127.0.0.1/ab_{tree}' --pairs 10

``{tree}`` in the URL becomes ``before`` or ``after``: each tree gets its own database
(create them first on a server; a newer schema is refused by an older tree). Each pair
runs one process per tree, alternating which goes first. A process does 300 untimed
cycles of ``Fleet.try_lock(…, keepalive=False)`` + ``release()``, then 5 rounds of 1,000
timed ones, and reports its median round. The result is the median over the pairs of
each tree, and the ratio after / before.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time

WARMUP = 300
ROUNDS = 5
CYCLES = 1000


def measure(url: str) -> tuple[float, float]:
    """Median (client CPU, wall) µs per cycle of this process's tree."""
    from fleetcron import Fleet

    fleet = Fleet(url, namespace="bench-ab")
    name = f"ab-{os.getpid()}"

    def cycle() -> None:
        lease = fleet.try_lock(name, lock_at_most="30s", keepalive=False)
        if lease is None or not lease.release():
            raise SystemExit("the lease was held by someone else")

    for _ in range(WARMUP):
        cycle()
    cpu, wall = [], []
    for _ in range(ROUNDS):
        gc.collect()
        gc.disable()
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(CYCLES):
            cycle()
        cpu.append((time.process_time() - c0) / CYCLES * 1e6)
        wall.append((time.perf_counter() - w0) / CYCLES * 1e6)
        gc.enable()
    fleet.close()
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the src directory of one tree")
    parser.add_argument("--after", required=True, help="the src directory of the other")
    parser.add_argument("--url", required=True, help="store URL; {tree} is before/after")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one process's run
    args = parser.parse_args()
    if args.measure:
        print(*measure(args.measure))
        return
    found: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for pair in range(args.pairs):
        order = ("before", "after") if pair % 2 == 0 else ("after", "before")
        for tree in order:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(getattr(args, tree))}
            url = args.url.replace("{tree}", tree)
            out = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--measure", url],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            found[tree].append((float(out[0]), float(out[1])))
    print("| tree | client CPU µs/cycle | wall µs/cycle |")
    print("|---|---|---|")
    medians = {}
    for tree, runs in found.items():
        medians[tree] = (
            statistics.median(c for c, _ in runs),
            statistics.median(w for _, w in runs),
        )
        print(f"| {tree} | {medians[tree][0]:.1f} | {medians[tree][1]:.0f} |")
    cpu = medians["after"][0] / medians["before"][0]
    wall = medians["after"][1] / medians["before"][1]
    print(f"| after / before | {cpu:.2f} | {wall:.2f} |")


if __name__ == "__main__":
    main()
