"""PostgreSQL behind PgBouncer in transaction pooling: every statement may land on another
server connection, so fleetcron keeps nothing in the session — no setting and no
server-side prepared statement once the backend URL says ``prepared_statements=off``
(psycopg prepares a statement run 5 times on a connection; PgBouncer before 1.21 cannot
carry it to the next server connection)."""

from __future__ import annotations

import psycopg

from fleetcron.models import job_lease_name
from fleetcron.stores import open_store, parse_store_url
from pgbouncer_server import PgBouncer


def test_leases_work_through_transaction_pooling_with_server_connections_shuffled(
    pgbouncer: PgBouncer, namespace: str
) -> None:
    first = open_store(parse_store_url(pgbouncer.store_url))
    second = open_store(parse_store_url(pgbouncer.store_url))
    # A transaction held open pins one server connection, so the two stores' statements
    # are spread over the others in turn.
    with psycopg.connect(pgbouncer.url) as pinning, pinning.transaction():
        pinning.execute("SELECT 1")
        try:
            for round_ in range(12):
                for store in (first, second):
                    name = job_lease_name(f"pooled-{round_}")
                    record = store.run(store.ops.lease_acquire(namespace, name, "h:1:t", 10**7, 0))
                    assert record is not None
                    assert store.run(
                        store.ops.lease_release(namespace, name, "h:1:t", record.fence)
                    )
                    namespace_ = namespace + "-other"
                    assert store.run(store.ops.lease_list(namespace_)) == []
        finally:
            first.close()
            second.close()
