"""One claimer of the queue's concurrency test: it drains a queue in batches and says what
it acknowledged.

Run as a script it is one process: it connects, prints ``ready``, waits for a line on stdin
(the start signal, so all claimers start together), claims batches of ``BATCH`` items until
a claim comes back empty twice, acknowledges each batch in one call, and prints
``{"holder": …, "claimed": [[id, fence], …], "acked": [[id, fence], …]}``. The in-memory
backend, which is one process, uses :func:`drain` from threads instead.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from fleetcron.stores import SyncStore, open_store, parse_store_url

BATCH = 7
VISIBILITY_US = 30_000_000  # never expires during the test
GIVE_UP_S = 45.0


def drain(store: SyncStore, namespace: str, queue: str, holder: str) -> dict[str, Any]:
    """Claim and acknowledge until the queue has nothing claimable (twice in a row)."""
    ops = store.ops
    claimed: list[list[int]] = []
    acked: list[list[int]] = []
    empty = 0
    give_up = time.monotonic() + GIVE_UP_S
    while empty < 2:
        assert time.monotonic() < give_up, f"{holder}: the queue was not drained in time"
        items = store.run(ops.queue_claim(namespace, queue, holder, BATCH, VISIBILITY_US))
        if not items:
            empty += 1
            time.sleep(0.005)
            continue
        empty = 0
        pairs = [(item.item_id, item.fence) for item in items]
        claimed += [list(pair) for pair in pairs]
        time.sleep(0.001)  # "work": give the others a chance at the same items
        answers = store.run(ops.queue_ack(namespace, queue, pairs))
        acked += [list(pair) for pair, ok in zip(pairs, answers, strict=True) if ok]
    return {"holder": holder, "claimed": claimed, "acked": acked}


def main(url: str, namespace: str, queue: str, holder: str) -> None:
    store = open_store(parse_store_url(url))
    try:
        store.run(store.ops.store_now())  # connected before "ready"
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        result = drain(store, namespace, queue, holder)
    finally:
        store.close()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
