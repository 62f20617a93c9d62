"""One claimer of the queue's concurrency test: it drains a queue in batches and says what
it acknowledged.

Run as a script it is one process: it connects, prints ``ready``, waits for a line on stdin
(the start signal, so all claimers start together), claims batches of ``BATCH`` items until
a claim comes back empty twice, acknowledges each batch in one call, and prints
``{"holder": …, "claimed": [[id, fence], …], "acked": [[id, fence], …]}``. With a fifth
argument ``churn`` it is a busy neighbour instead: from the start signal until a second
line (``stop``) it puts, claims and acknowledges one item at a time and claims the empty
queue, then prints ``{"holder": …, "rounds": n}``. The in-memory backend, which is one process, uses
:func:`drain` and :func:`churn` from threads instead.
"""

from __future__ import annotations

import json
import select
import sys
import time
from collections.abc import Callable
from typing import Any

from fleetcron.queue_models import QueuePut
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


def churn(
    store: SyncStore, namespace: str, queue: str, holder: str, stopped: Callable[[], bool]
) -> dict[str, Any]:
    """Put, claim and acknowledge one item at a time, then claim the empty queue a few
    times, until ``stopped()``."""
    ops = store.ops
    rounds = 0
    while not stopped():
        store.run(ops.queue_put(namespace, queue, [QueuePut(payload=json.dumps(rounds))]))
        items = store.run(ops.queue_claim(namespace, queue, holder, 1, VISIBILITY_US))
        store.run(ops.queue_ack(namespace, queue, [(i.item_id, i.fence) for i in items]))
        # and claims of an empty queue, whose index range ends at the next queue's items
        for _ in range(3):
            store.run(ops.queue_claim(namespace, queue, holder, 1, VISIBILITY_US))
        rounds += 1
    return {"holder": holder, "rounds": rounds}


def _stop_line_arrived() -> bool:
    return bool(select.select([sys.stdin], [], [], 0)[0])


def main(url: str, namespace: str, queue: str, holder: str, mode: str = "drain") -> None:
    store = open_store(parse_store_url(url))
    try:
        store.run(store.ops.store_now())  # connected before "ready"
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        if mode == "churn":
            result = churn(store, namespace, queue, holder, _stop_line_arrived)
        else:
            result = drain(store, namespace, queue, holder)
    finally:
        store.close()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
