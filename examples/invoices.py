"""The monthly invoice job, made safe to run on every replica, twice, and through crashes.

One process plays a whole fleet here; run it as often as you like — each customer gets one
invoice per period, whatever runs twice:

    python examples/invoices.py                 # SQLite files in ./invoices-demo/
    python examples/invoices.py --period 2026-11
    FLEETCRON_BACKEND=postgresql://… python examples/invoices.py

1. The scheduled step only *enqueues*: one item per customer, with a dedupe key
   ``invoice:<customer>:<period>``, so a second run of the step queues nothing new.
2. Workers claim items in batches. A crashed worker costs its batch: the claims expire and
   the items are delivered again — with a higher fence.
3. Each item is one transaction of the application's database that does three things:
   the **fence check** (a stale worker, paused past its claim, writes nothing), the
   **natural key** (``UNIQUE (customer, period)``: a second invoice is refused by the
   database) and the **processed marker** (committed with the work, so a repeated
   delivery skips it). Each alone narrows the window; together they close it.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from pathlib import Path

from fleetcron import Claimed, Entry, Fleet, fencing

NAMESPACE = "invoices-demo"
CUSTOMERS = {"cust-4211": 129_900, "cust-4212": 4_500, "cust-4213": 88_000}


def app_database(path: Path) -> sqlite3.Connection:
    """The application's own database (here SQLite; psycopg, PyMySQL and SQLAlchemy
    connections work the same with fleetcron.fencing)."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS invoices ("
        " customer text NOT NULL, period text NOT NULL, amount_cents integer NOT NULL,"
        " UNIQUE (customer, period))"  # the natural key: one invoice per customer and period
    )
    fencing.create_tables(conn)
    return conn


def enqueue(fleet: Fleet, period: str) -> int:
    """The scheduled step: one item per customer; how many were new."""
    queue = fleet.queue("invoices")
    ids = queue.put_many(
        Entry({"customer": c, "period": period}, dedupe_key=f"invoice:{c}:{period}")
        for c in CUSTOMERS
    )
    return sum(item_id is not None for item_id in ids)


def invoice(conn: sqlite3.Connection, item: Claimed) -> None:
    """One item: fence check, natural key and processed marker in one transaction."""
    customer, period = item.value["customer"], item.value["period"]
    conn.execute("BEGIN IMMEDIATE")
    try:
        fencing.check(conn, f"invoices/{item.item_id}", item.fence)  # StaleFence: rolled back
        if fencing.once(conn, f"invoice:{customer}:{period}", fence=item.fence):
            conn.execute(
                "INSERT INTO invoices (customer, period, amount_cents) VALUES (?, ?, ?) "
                "ON CONFLICT (customer, period) DO NOTHING",
                (customer, period, CUSTOMERS[customer]),
            )
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def drain(fleet: Fleet, conn: sqlite3.Connection) -> None:
    """A worker: handle items until none is left to claim (a replica's worker would run
    on: ``queue.work(…)`` without ``until_empty``)."""
    queue = fleet.queue("invoices", visibility="30s")
    queue.work(lambda item: invoice(conn, item), batch=10, until_empty=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--period", default="2026-10")
    parser.add_argument("--dir", type=Path, default=Path("invoices-demo"))
    args = parser.parse_args(argv)
    args.dir.mkdir(exist_ok=True)
    default = f"sqlite:///{(args.dir / 'fleetcron.db').resolve()}"
    backend = os.environ.get("FLEETCRON_BACKEND") or default
    conn = app_database(args.dir / "app.db")
    with Fleet(backend, namespace=NAMESPACE) as fleet:
        sys.stdout.write(f"queued {enqueue(fleet, args.period)} new item(s) for {args.period}\n")
        drain(fleet, conn)
    for customer, period, cents in conn.execute(
        "SELECT customer, period, amount_cents FROM invoices ORDER BY period, customer"
    ):
        sys.stdout.write(f"{period} {customer} {cents / 100:>10.2f}\n")


if __name__ == "__main__":
    main()
