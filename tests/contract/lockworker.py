"""One contender of the mutual-exclusion test (ShedLock's FuzzTester, with fences).

Run as a script it is one process: it connects, prints ``ready``, waits for a line on
stdin (the start signal, so all contenders start together), contends, and prints its
grants as JSON. The in-memory backend, which is one process, uses :func:`contend` from
threads instead.

Under the lock it reads a shared counter from a file, sleeps ~1 ms and writes counter + 1:
if two holders ever overlap, an update is lost or a value is read twice.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fleetcron import Fleet


def contend(fleet: Fleet, name: str, counter: Path, attempts: int) -> dict[str, object]:
    """Try ``attempts`` times; return ``{"grants": [[counter_seen, fence], …], "refused": n}``."""
    grants: list[list[int]] = []
    refused = 0
    for _ in range(attempts):
        lease = fleet.try_lock(name, lock_at_most="30s", keepalive=False)
        if lease is None:
            refused += 1
            time.sleep(0.001)
            continue
        try:
            seen = int(counter.read_text())
            time.sleep(0.001)
            counter.write_text(str(seen + 1))
            grants.append([seen, lease.fence])
        finally:
            lease.release()
    return {"grants": grants, "refused": refused}


def main(url: str, namespace: str, name: str, counter: str, attempts: str) -> None:
    with Fleet(url, namespace=namespace) as fleet:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        result = contend(fleet, name, Path(counter), int(attempts))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
