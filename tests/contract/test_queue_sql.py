"""The work queue on the SQL backends: what only they can get wrong.

``test_queue.py`` is the contract every backend keeps. This file checks what the SQL
implementations (``stores/sql/queue.py`` and the dialects' ``queries.sql``) could get
wrong beyond it: answers put back in input order from set-based statements (checked
against the reference, the in-memory store, running the same calls), locks between
processes (puts racing on the same new dedupe keys in opposite orders, a claim meeting a
row another transaction holds), ids after pruning, large payloads, the async runners and
the MySQL retry of a deadlocked transaction.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pymysql
import pytest

from contract.contract_support import run_together
from fleetcron.queue_models import QueueItem, QueueNack, QueuePut
from fleetcron.stores import SyncStore, open_async_store, parse_store_url
from fleetcron.stores.sql.files import load_queries
from fleetcron.stores.sql.mysql import connect_args, resendable

EVERY = pytest.mark.parametrize(
    "backend_url", ["memory", "sqlite", "postgres", "mysql"], indirect=True
)
SQL = pytest.mark.parametrize("backend_url", ["sqlite", "postgres", "mysql"], indirect=True)
SERVERS = pytest.mark.parametrize("backend_url", ["postgres", "mysql"], indirect=True)

LONG = 30_000_000
SHORT = 300_000


def put(store: SyncStore, ns: str, puts: list[QueuePut], queue: str = "q") -> list[int | None]:
    return store.run(store.ops.queue_put(ns, queue, puts))


def claim(store: SyncStore, ns: str, limit: int, visibility_us: int = LONG) -> list[QueueItem]:
    return store.run(store.ops.queue_claim(ns, "q", "h1", limit, visibility_us))


def wait_until(store: SyncStore, target_us: int) -> None:
    give_up = time.monotonic() + 10
    while store.run(store.ops.store_now()) < target_us:
        assert time.monotonic() < give_up, "the store clock did not reach the target"
        time.sleep(0.02)


def shape(answers: list[Any]) -> list[str]:
    """Answers with ids replaced by what they are (ids differ between backends)."""
    return ["id" if isinstance(a, int) and not isinstance(a, bool) else repr(a) for a in answers]


# -- answers in input order, as the reference gives them ---------------------------------------


@EVERY
def test_a_large_batch_is_answered_in_input_order_with_its_repeats_refused(
    store: SyncStore, namespace: str
) -> None:
    (taken,) = put(store, namespace, [QueuePut(payload='"old"', dedupe_key="k-7")])
    puts = []
    for n in range(3000):
        key = None if n % 3 == 0 else f"k-{n % 500}"  # keys repeat within the batch
        puts.append(QueuePut(payload=json.dumps({"n": n, "é": "🎉"}), dedupe_key=key))

    ids = put(store, namespace, puts)

    seen: set[str] = {"k-7"}
    for p, item_id in zip(puts, ids, strict=True):
        if p.dedupe_key is not None and p.dedupe_key in seen:
            assert item_id is None, p
            continue
        assert item_id is not None, p
        if p.dedupe_key is not None:
            seen.add(p.dedupe_key)
    given = [i for i in ids if i is not None]
    assert given == sorted(given)
    assert len(set(given)) == len(given)
    assert taken is not None
    assert min(given) > taken
    listed = store.run(store.ops.queue_list(namespace, "q", None, 10_000))
    payloads = {item.item_id: (item.payload, item.dedupe_key) for item in listed}
    for p, item_id in zip(puts, ids, strict=True):
        if item_id is not None:
            assert payloads[item_id] == (p.payload, p.dedupe_key)


@EVERY
def test_repeats_within_a_batch_are_answered_as_the_reference_answers_them(
    store: SyncStore, namespace: str
) -> None:
    ops = store.ops
    assert shape(put(store, namespace, [QueuePut(payload="1", dedupe_key="a")] * 2)) == [
        "id",
        "None",
    ]
    put(store, namespace, [QueuePut(payload='"b"', max_attempts=1)])
    put(store, namespace, [QueuePut(payload=str(n), max_attempts=3) for n in range(3)])
    a, b, c, d, e = claim(store, namespace, 5)
    stale = (a.item_id, a.fence - 1)

    extended = store.run(ops.queue_extend(namespace, "q", [(a.item_id, a.fence)] * 2, LONG))
    assert extended[0] is not None
    assert extended == [extended[0]] * 2, "a held claim extended twice, to the same time"
    assert store.run(
        ops.queue_ack(namespace, "q", [stale, (a.item_id, a.fence), (a.item_id, a.fence)])
    ) == [False, True, False]
    nacks = [QueueNack(item_id=b.item_id, fence=b.fence, error=f"e{n}") for n in range(2)]
    assert store.run(ops.queue_nack(namespace, "q", nacks)) == ["dead", None]
    dead = store.run(ops.queue_get(namespace, "q", b.item_id))
    assert dead is not None
    assert dead.error == "e0", "the first nack of the claim is the one applied"
    nack_c = QueueNack(item_id=c.item_id, fence=c.fence, error="x", retry_in_us=LONG)
    assert store.run(ops.queue_nack(namespace, "q", [nack_c])) == ["ready"]
    assert store.run(ops.queue_requeue(namespace, "q", [b.item_id, b.item_id, c.item_id])) == 1
    answers = store.run(ops.queue_ack(namespace, "q", [(e.item_id, e.fence), (d.item_id, d.fence)]))
    assert answers == [True, True], "answers in input order, not id order"


@EVERY
def test_an_item_dying_of_an_expired_claim_takes_its_place_in_the_claims_limit(
    store: SyncStore, namespace: str
) -> None:
    (dies,) = put(store, namespace, [QueuePut(payload='"dies"', max_attempts=1)])
    (first,) = claim(store, namespace, 1, SHORT)
    wait_until(store, first.available_us)
    later = put(store, namespace, [QueuePut(payload=str(n)) for n in range(3)])

    got = claim(store, namespace, 3)

    assert [item.item_id for item in got] == later[:2], "the dead item counted in the limit"
    assert dies is not None
    dead = store.run(store.ops.queue_get(namespace, "q", dies))
    assert dead is not None
    assert (dead.state, dead.holder, dead.available_us) == ("dead", "h1", first.available_us)
    assert [item.item_id for item in claim(store, namespace, 3)] == later[2:]


# -- ids, payloads ------------------------------------------------------------------------------


@SQL
def test_the_id_of_the_newest_item_is_not_given_again_once_it_is_pruned(
    store: SyncStore, namespace: str
) -> None:
    (first,) = put(store, namespace, [QueuePut(payload="1", dedupe_key="k")])
    (item,) = claim(store, namespace, 1)
    assert store.run(store.ops.queue_ack(namespace, "q", [(item.item_id, item.fence)])) == [True]
    wait_until(store, store.run(store.ops.store_now()) + 1_000)
    assert store.run(store.ops.queue_prune(namespace, "q", 0, 10)) == 1

    (again,) = put(store, namespace, [QueuePut(payload="1", dedupe_key="k")])

    assert first is not None
    assert again is not None
    assert again > first


@SQL
def test_a_payload_of_several_megabytes_comes_back_byte_for_byte(
    store: SyncStore, namespace: str
) -> None:
    # ~3 MB of JSON text, quotes, backslashes and non-ASCII included.
    payload = json.dumps({"rows": [{"k": f"v'{n}\\;", "é": "🎉"} for n in range(75_000)]})
    (item_id,) = put(store, namespace, [QueuePut(payload=payload)])
    assert item_id is not None
    got = store.run(store.ops.queue_get(namespace, "q", item_id))
    assert got is not None
    assert got.payload == payload
    (claimed,) = claim(store, namespace, 1)
    assert claimed.payload == payload


@SQL
async def test_the_async_runners_carry_the_queue_operations(
    backend_url: str, namespace: str
) -> None:
    store = await open_async_store(parse_store_url(backend_url))
    try:
        ops = store.ops
        puts = [QueuePut(payload="1", dedupe_key="k")] * 2
        assert shape(await store.run(ops.queue_put(namespace, "q", puts))) == ["id", "None"]
        (item,) = await store.run(ops.queue_claim(namespace, "q", "h", 5, LONG))
        acked = await store.run(ops.queue_ack(namespace, "q", [(item.item_id, item.fence)]))
        assert acked == [True]
        (stats,) = await store.run(ops.queue_stats(namespace, None))
        assert (stats.queue, stats.done, stats.depth) == ("q", 1, 0)
    finally:
        await store.close()


# -- locks between processes and transactions ---------------------------------------------------

_PUTTER = """
import json, random, sys
from fleetcron.queue_models import QueuePut
from fleetcron.stores import open_store, parse_store_url
url, namespace, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = open_store(parse_store_url(url))
rng = random.Random(me)
print("ready", flush=True)
sys.stdin.readline()
answers = []
for r in range(rounds):
    keys = [f"r{r}-k{n}" for n in range(30)]
    rng.shuffle(keys)  # every order, to expose lock-order deadlocks
    puts = [QueuePut(payload=json.dumps(k), dedupe_key=k) for k in keys]
    puts += [QueuePut(payload='"no key"')] * 2
    ids = store.run(store.ops.queue_put(namespace, "q", puts))
    answers.append([[p.dedupe_key, i] for p, i in zip(puts, ids)])
print(json.dumps(answers))
"""


@SQL
def test_puts_racing_on_the_same_new_keys_in_any_order_give_each_key_once(
    backend_url: str, namespace: str, store: SyncStore
) -> None:
    answers = run_together(
        [[sys.executable, "-c", _PUTTER, backend_url, namespace, str(n), "4"] for n in range(5)],
        "putter",
        timeout_s=120,
    )
    batches = [batch for answer in answers for batch in answer]

    given: dict[str, list[int]] = {}
    for batch in batches:
        ids = [item_id for _, item_id in batch if item_id is not None]
        assert ids == sorted(ids), "ids increase in input order"
        for key, item_id in batch:
            if key is None:
                assert item_id is not None
            elif item_id is not None:
                given.setdefault(key, []).append(item_id)
    assert len(given) == 4 * 30
    assert all(len(ids) == 1 for ids in given.values()), "a key was given twice"
    listed = store.run(store.ops.queue_list(namespace, "q", None, 10_000))
    assert {item.item_id: item.dedupe_key for item in listed if item.dedupe_key} == {
        ids[0]: key for key, ids in given.items()
    }
    assert all(item.holder is None for item in listed)


def _lock_item(backend_url: str, item_id: int) -> Any:
    """A connection of its own holding a row lock on ``item_id`` in an open transaction."""
    url = parse_store_url(backend_url)
    if url.kind == "postgres":
        import psycopg

        pg = psycopg.connect(backend_url)
        pg.execute("SELECT id FROM fleetcron_queue_item WHERE id = %s FOR UPDATE", (item_id,))
        return pg
    my = pymysql.connect(**connect_args(url))
    with my.cursor() as cur:
        cur.execute("START TRANSACTION")
        cur.execute("SELECT id FROM fleetcron_queue_item WHERE id = %s FOR UPDATE", (item_id,))
    return my


@SERVERS
def test_a_claim_skips_an_item_another_transaction_holds_without_waiting_for_it(
    backend_url: str, store: SyncStore, namespace: str
) -> None:
    ids = put(store, namespace, [QueuePut(payload=str(n)) for n in range(3)])
    assert ids[0] is not None
    other = _lock_item(backend_url, ids[0])
    try:
        started = time.monotonic()
        got = claim(store, namespace, 3)
        assert time.monotonic() - started < 2, "the claim waited for the other transaction"
        assert [item.item_id for item in got] == ids[1:]
    finally:
        other.rollback()
        other.close()
    assert [item.item_id for item in claim(store, namespace, 3)] == ids[:1]


def _hold_open(backend_url: str, operation: Any) -> Any:
    """A connection of its own that has run ``operation`` (a queue operation of the store,
    its one named query with the parameters the store gives it) inside a transaction it
    keeps open: what the operation locks stays locked."""
    query = next(operation)
    url = parse_store_url(backend_url)
    text = load_queries(url.kind)[query.name]
    if url.kind == "postgres":
        import psycopg

        pg = psycopg.connect(backend_url)
        pg.execute(text, query.params)
        return pg
    my = pymysql.connect(**connect_args(url))
    with my.cursor() as cur:
        cur.execute(text[: text.rindex("COMMIT")], query.params)
        while cur.nextset():
            pass
    return my


@SERVERS
@pytest.mark.parametrize("held", ["claim", "put"])
def test_an_open_claim_or_put_hides_no_item_of_another_queue_or_the_newest_item(
    backend_url: str, store: SyncStore, namespace: str, held: str
) -> None:
    """A claim locks only the items it takes (on MariaDB a locking range scan would also
    lock the first index entry past its range: the next queue's oldest item, which claims
    there would skip), and a put locks only what it inserts (not the newest item)."""
    (mine,) = put(store, namespace, [QueuePut(payload='"mine"')], queue="q")
    ops = store.ops
    if held == "claim":  # of the empty queue just before "q" in the claim index
        other = _hold_open(backend_url, ops.queue_claim(namespace, "p", "h0", 10, LONG))
    else:
        theirs = [QueuePut(payload='"theirs"')]
        other = _hold_open(backend_url, ops.queue_put(namespace, "p", theirs))
    try:
        started = time.monotonic()
        got = claim(store, namespace, 10)
        assert time.monotonic() - started < 2, "the claim waited for the other transaction"
        assert [item.item_id for item in got] == [mine]
    finally:
        other.rollback()
        other.close()


# -- PostgreSQL plans that do not hang on statistics --------------------------------------------


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _plan_nodes(child))]


@pytest.mark.parametrize("backend_url", ["postgres"], indirect=True)
def test_postgres_serves_a_queue_its_statistics_have_not_seen_through_the_right_indexes(
    backend_url: str, store: SyncStore, namespace: str
) -> None:
    """A queue new to the statistics is estimated at one row; the claim must still walk
    the claim index in order (no sort of the whole queue) and an ack or extend must find
    its items by primary key (not read the whole queue to match ids). The plans are the
    ones the queue functions really run, as auto_explain reports them."""
    import psycopg

    from fleetcron.stores.sql.files import load_queries
    from fleetcron.stores.sql.queue import _claim_params

    queries = load_queries("postgres")
    with psycopg.connect(backend_url, autocommit=True) as pg:
        pg.execute("ANALYZE fleetcron_queue_item")  # the statistics, before this queue
        put(store, namespace, [QueuePut(payload=str(n)) for n in range(3000)])
        held = claim(store, namespace, 100)

        notices: list[str] = []
        pg.add_notice_handler(lambda notice: notices.append(notice.message_primary or ""))
        pg.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_format = json",
            "auto_explain.log_level = notice",
        ):
            pg.execute(f"SET {setting}")

        def plan(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
            """The nodes of the plan of the statement inside the function ``name`` calls."""
            notices.clear()
            pg.execute(queries[name], params).fetchall()
            inner = [
                json.loads(text[text.index("{") :])
                for text in notices
                if "UPDATE fleetcron_queue_item" in text
            ]
            assert len(inner) == 1, notices
            return _plan_nodes(inner[0]["Plan"])

        claim_nodes = plan("queue_claim", _claim_params(namespace, "q", "h2", 100, LONG))
        picked = [
            n
            for n in claim_nodes
            if n.get("Node Type") == "Index Scan" and "live" in n.get("Index Cond", "")
        ]
        assert [n["Index Name"] for n in picked] == ["fleetcron_queue_item_live"], claim_nodes
        sorts = [
            n
            for n in claim_nodes
            if "Sort" in n["Node Type"] and "available_us" in str(n.get("Sort Key"))
        ]
        assert not sorts, "the claim sorts the queue"

        claims = json.dumps([[item.item_id, item.fence] for item in held])
        by_id: list[tuple[str, dict[str, Any]]] = [
            ("queue_extend", {"claims": claims, "visibility_us": LONG}),
            ("queue_ack", {"claims": claims}),
        ]
        for name, extra in by_id:
            nodes = plan(name, {"namespace": namespace, "queue": "q", **extra})
            reads = [
                n
                for n in nodes
                if n.get("Relation Name") == "fleetcron_queue_item"
                and n["Node Type"] != "ModifyTable"
            ]
            found = [n for n in nodes if "Index Name" in n]
            assert reads, (name, nodes)
            assert all("Index" in n["Node Type"] or "Bitmap" in n["Node Type"] for n in reads), (
                name,
                reads,
            )
            assert {n["Index Name"] for n in found} == {"fleetcron_queue_item_pkey"}, (name, found)


# -- the MySQL retry of a deadlocked transaction ------------------------------------------------


@pytest.mark.parametrize(
    ("code", "sql", "resent"),
    [
        (1213, "START TRANSACTION;\nUPDATE t SET x = 1;\nCOMMIT", True),
        (1467, "  start transaction;\nINSERT INTO t SELECT 1;\nCOMMIT", True),
        (1213, "UPDATE t SET x = 1;\nSELECT x FROM t", False),  # may have committed a part
        (1205, "START TRANSACTION;\nUPDATE t SET x = 1;\nCOMMIT", False),  # a lock wait
        (1062, "START TRANSACTION;\nINSERT INTO t VALUES (1);\nCOMMIT", False),
    ],
)
def test_mysql_sends_again_only_a_whole_transaction_refused_by_a_deadlock(
    code: int, sql: str, resent: bool
) -> None:
    assert resendable(pymysql.err.OperationalError(code, "refused"), sql) is resent
    assert not resendable(None, sql)
