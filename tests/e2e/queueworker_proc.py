"""A queue worker process of the queue fault test: drains queue ``work`` into the
application's SQLite database, each item one transaction — fence check, processed marker,
the effect — and logs what it did, one line per event, flushed at once:

    start <item> <fence>       the handler began (then it pauses WORK_S before writing)
    wrote <item> <fence>       the transaction committed
    stale <item> <fence>       fencing.check refused it: another worker has the item now
    skip <item> <fence>        the marker says the item's effect committed already

Run as ``python queueworker_proc.py URL NAMESPACE APP_DB LOG``.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time

from fleetcron import Claimed, Fleet, fencing
from fleetcron.fencing import StaleFence

WORK_S = 0.5


def main(url: str, namespace: str, app_db: str, log_path: str) -> None:
    conn = sqlite3.connect(app_db, timeout=30, isolation_level=None)
    log = open(log_path, "a", buffering=1)

    def say(event: str, item: Claimed) -> None:
        log.write(f"{os.getpid()} {event} {item.item_id} {item.fence}\n")
        log.flush()

    def handle(item: Claimed) -> None:
        say("start", item)
        time.sleep(WORK_S)  # the work before the write: a pause here makes a stale worker
        conn.execute("BEGIN IMMEDIATE")
        try:
            fencing.check(conn, f"work/{item.item_id}", item.fence)
            if fencing.once(conn, f"work:{item.item_id}", fence=item.fence):
                conn.execute(
                    "INSERT INTO effects (item, pid, fence) VALUES (?, ?, ?)",
                    (item.item_id, os.getpid(), item.fence),
                )
                outcome = "wrote"
            else:
                outcome = "skip"
        except StaleFence:
            conn.execute("ROLLBACK")
            say("stale", item)
            raise
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        say(outcome, item)

    with Fleet(url, namespace=namespace) as fleet:
        queue = fleet.queue("work", visibility="1s", retry_backoff=0)
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        queue.work(handle, batch=3, idle="20ms")


if __name__ == "__main__":
    main(*sys.argv[1:])
