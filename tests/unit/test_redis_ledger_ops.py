"""The Redis run-ledger operations driven without Redis: statements out, canned replies in.

What is checked is each operation's own logic: which script, on which keys (all of one
claim under one hash tag), with which arguments, and how the script's reply maps back to
records. The scripts themselves run against a real Redis in
``tests/contract/test_ledger_redis.py``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from fleetcron.models import JobRecord, RunOutcome, RunRecord, SlotClaim, job_lease_name
from fleetcron.stores.base import drive
from fleetcron.stores.ledger import LOST_ERROR, MISSED_ERROR, OUTPUT_LIMIT
from fleetcron.stores.redis.keys import (
    job_key,
    jobs_pattern,
    lease_key,
    namespace_pattern,
    run_key,
    slots_key,
    slots_pattern,
)
from fleetcron.stores.redis.operations import RedisOperations
from fleetcron.stores.redis.scripts import REPLY_ROWS, SCRIPT_BLOCKS, SCRIPTS
from fleetcron.stores.redis.statements import KeyScan, Script, ScriptCalls, fan_out
from fleetcron.stores.redis.store import RedisStore
from unit.fakes import FakeExecute

REDIS = RedisOperations()
NS = "ns"
LEASE = lease_key(NS, "fleetcron:job:backup")
JOB = job_key(NS, "backup")
RUN = run_key(NS, "backup", 1_000)
SLOTS = slots_key(NS, "backup")


def run_reply(
    job: str = "backup",
    slot: int = 1_000,
    *,
    state: str = "running",
    cancel: int = 0,
    **fields: bytes | int | None,
) -> list[bytes | int | None]:
    """A ``run_row`` reply as redis-py returns it: the layout ``-- row run`` declares
    (scripts.lua), numbers as integers, text as bytes, NULL as None."""
    row: dict[str, bytes | int | None] = {
        "job": job.encode(),
        "slot_us": slot,
        "state": state.encode(),
        "attempt": 1,
        "fence": 7000,
        "holder": b"host:1:abc",
        "run_id": b"run-1",
        "trigger": b"schedule",
        "started_us": 7000,
        "finished_us": None,
        "expires_us": 9000,
        "retry_at_us": None,
        "cancel_requested": cancel,
        "exit_code": None,
        "error": None,
        "output": None,
        "now_us": 7000,
    }
    row.update(fields)
    return [row[column] for column in REPLY_ROWS["run"]]


RUNNING = RunRecord(
    namespace=NS,
    job="backup",
    slot_us=1_000,
    state="running",
    attempt=1,
    fence=7_000,
    holder="host:1:abc",
    run_id="run-1",
    trigger="schedule",
    started_us=7_000,
    finished_us=None,
    expires_us=9_000,
    retry_at_us=None,
    cancel_requested=False,
    exit_code=None,
    error=None,
    output=None,
    now_us=7_000,
)


def job_reply(**fields: bytes | int | None) -> list[bytes | int | None]:
    """A ``job_row`` reply in the layout ``-- row job`` declares (scripts.lua)."""
    return [fields[column] for column in REPLY_ROWS["job"]]


JOB_REPLY = job_reply(
    job=b"backup",
    paused=0,
    definition=b'{"cron": "@daily"}',
    fingerprint=b"fp",
    high_water_us=1000,
    last_success_us=None,
    last_failure_us=800,
    updated_us=500,
    now_us=7000,
)
JOB_ROW = JobRecord(
    namespace=NS,
    job="backup",
    paused=False,
    definition='{"cron": "@daily"}',
    fingerprint="fp",
    high_water_us=1_000,
    last_success_us=None,
    last_failure_us=800,
    updated_us=500,
    now_us=7_000,
)


# -- keys ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("namespace", "job"), [("ns", "backup"), ("a:b", "c}d"), ("name space", "j{x}"), ("☃", "é")]
)
def test_every_key_of_a_job_is_in_the_cluster_slot_of_the_job_lease(
    namespace: str, job: str
) -> None:
    lease = lease_key(namespace, job_lease_name(job))
    keys = [job_key(namespace, job), run_key(namespace, job, 42), slots_key(namespace, job)]

    assert {key_slot(key.encode()) for key in keys} == {key_slot(lease.encode())}
    assert all(key.startswith(lease) and not key.endswith("}") for key in keys)


def test_key_layout_is_the_documented_one() -> None:
    assert JOB == "fleetcron:{2:ns:fleetcron:job:backup}:job"
    assert RUN == "fleetcron:{2:ns:fleetcron:job:backup}:run:1000"
    assert SLOTS == "fleetcron:{2:ns:fleetcron:job:backup}:slots"


def test_the_job_scan_pattern_matches_job_rows_only() -> None:
    pattern = jobs_pattern("a*b")
    assert pattern == "fleetcron:{3:a\\*b:fleetcron:job:*}:job"

    def matches(key: str) -> bool:  # Redis glob: \\x is a literal x, * anything
        regex = "".join(
            ".*" if part == "*" else re.escape(part[-1])
            for part in re.findall(r"\\.|\*|.", pattern)
        )
        return re.fullmatch(regex, key) is not None

    assert matches(job_key("a*b", "x"))
    assert matches(job_key("a*b", "x}:job"))
    assert not matches(lease_key("a*b", "fleetcron:job:x"))
    assert not matches(run_key("a*b", "x", 1))
    assert not matches(slots_key("a*b", "x"))
    assert not matches(job_key("a*bc", "x"))
    assert not matches(job_key("a-b", "x"))


# -- run_claim ---------------------------------------------------------------------------
CLAIMS = [
    SlotClaim(job="backup", slot_us=1_000, run_id="run-1"),
    SlotClaim(
        job="report",
        slot_us=2_000,
        run_id="run-2",
        exclusive=False,
        max_attempts=3,
        trigger="manual",
        least_us=50,
    ),
    SlotClaim(job="backup", slot_us=3_000, run_id="run-3", trigger="backfill", deadline_us=9_000),
]
REPORT_KEYS = (
    lease_key(NS, "fleetcron:job:report"),
    job_key(NS, "report"),
    run_key(NS, "report", 2_000),
    slots_key(NS, "report"),
)
BACKUP_3_KEYS = (LEASE, JOB, run_key(NS, "backup", 3_000), SLOTS)
COMMON = ("host:1:abc", 5_000, NS, LOST_ERROR, MISSED_ERROR)
# slot, run id, exclusive, attempts, trigger, least, job, lease, deadline, progress, pausable
BACKUP_1_ARGS = (1_000, "run-1", 1, 1, "schedule", 0, "backup", "fleetcron:job:backup", "", 1, 1)
REPORT_ARGS = (2_000, "run-2", 0, 3, "manual", 50, "report", "fleetcron:job:report", "", 0, 0)
BACKUP_3_ARGS = (
    3_000, "run-3", 1, 1, "backfill", 0, "backup", "fleetcron:job:backup", "=9000", 0, 0,
)  # fmt: skip


def test_a_claim_batch_on_one_server_is_one_script_call_deciding_every_claim() -> None:
    execute = FakeExecute([[run_reply(), b"busy", run_reply(slot=3_000)]])

    answers = drive(REDIS.run_claim(NS, CLAIMS, "host:1:abc", 5_000), execute)

    assert [(a.job, a.slot_us, a.status) for a in answers] == [
        ("backup", 1_000, "claimed"),
        ("report", 2_000, "busy"),
        ("backup", 3_000, "claimed"),
    ]
    assert answers[0].run == RUNNING
    assert answers[1].run is None
    assert execute.statements == [
        ScriptCalls(
            "run_claim",
            (
                (
                    (LEASE, JOB, RUN, SLOTS, *REPORT_KEYS, *BACKUP_3_KEYS),
                    (*COMMON, *BACKUP_1_ARGS, *REPORT_ARGS, *BACKUP_3_ARGS),
                ),
            ),
        )
    ]


def test_a_claim_batch_on_a_cluster_is_one_call_per_job_each_in_one_hash_slot() -> None:
    cluster = RedisOperations(cluster=True)
    execute = FakeExecute([[b"taken", run_reply(slot=3_000)], [run_reply("report", 2_000)]])

    answers = drive(cluster.run_claim(NS, CLAIMS, "host:1:abc", 5_000), execute)

    assert [(a.job, a.slot_us, a.status) for a in answers] == [
        ("backup", 1_000, "taken"),
        ("report", 2_000, "claimed"),
        ("backup", 3_000, "claimed"),
    ]
    assert [a.run.slot_us for a in answers if a.run is not None] == [2_000, 3_000]
    [statement] = execute.statements
    assert isinstance(statement, ScriptCalls)
    assert statement.calls == (
        ((LEASE, JOB, RUN, SLOTS, *BACKUP_3_KEYS), (*COMMON, *BACKUP_1_ARGS, *BACKUP_3_ARGS)),
        (REPORT_KEYS, (*COMMON, *REPORT_ARGS)),
    )
    for keys, _args in statement.calls:
        assert len({key_slot(key.encode()) for key in keys}) == 1


def test_every_claim_is_answered_in_input_order_with_the_run_or_the_reason() -> None:
    execute = FakeExecute([[b"not_due", run_reply("b"), "paused", run_reply("d")]])
    claims = [SlotClaim(job=job, slot_us=1_000, run_id=job) for job in "abcd"]

    answers = drive(REDIS.run_claim(NS, claims, "h", 1), execute)

    assert [(a.job, a.status) for a in answers] == [
        ("a", "not_due"),
        ("b", "claimed"),
        ("c", "paused"),
        ("d", "claimed"),
    ]
    assert [a.run.job if a.run else None for a in answers] == [None, "b", None, "d"]


def test_an_empty_claim_batch_asks_nothing() -> None:
    execute = FakeExecute()

    assert drive(REDIS.run_claim(NS, [], "h", 1), execute) == []
    assert execute.statements == []


def test_a_reclaimed_row_maps_its_note_and_every_optional_field() -> None:
    reply = run_reply(
        state="running",
        attempt=2,
        error=f"attempt 1 lost: {LOST_ERROR}".encode(),
        cancel=1,
        exit_code=-9,
        retry_at_us=8000,
        finished_us=7500,
        output="naïve ☃".encode(),
    )
    [answer] = drive(
        REDIS.run_claim(NS, [SlotClaim(job="backup", slot_us=1, run_id="r")], "h", 1),
        FakeExecute([[reply]]),
    )
    run = answer.run
    assert run is not None

    assert (run.attempt, run.error, run.cancel_requested) == (
        2,
        f"attempt 1 lost: {LOST_ERROR}",
        True,
    )
    assert (run.exit_code, run.retry_at_us, run.finished_us, run.output) == (
        -9,
        8_000,
        7_500,
        "naïve ☃",
    )
    assert type(run.fence) is int
    assert type(run.slot_us) is int


# -- the other run operations ----------------------------------------------------------------
def test_extend_binds_fence_and_length_on_the_lease_and_the_run_row() -> None:
    execute = FakeExecute(run_reply(cancel=1), False)

    renewed = drive(REDIS.run_extend(NS, "backup", 1_000, 7_000, 30_000), execute)

    assert renewed is not None
    assert renewed.cancel_requested
    assert drive(REDIS.run_extend(NS, "backup", 1_000, 6_999, 30_000), execute) is None
    assert execute.statements[0] == Script("run_extend", (LEASE, RUN), (7_000, 30_000))


def test_finish_encodes_nulls_and_keeps_the_last_4096_characters_of_output() -> None:
    output = "x" * 10 + "é" * OUTPUT_LIMIT
    execute = FakeExecute(1, 0)
    outcome = RunOutcome(state="failed", exit_code=0, error="", output=output, retry_after_us=60)

    assert drive(REDIS.run_finish(NS, "backup", 1_000, 7_000, outcome), execute) is True
    assert (
        drive(REDIS.run_finish(NS, "backup", 1_000, 7_000, RunOutcome(state="succeeded")), execute)
        is False
    )
    first, second = execute.statements
    assert first == Script(
        "run_finish",
        (LEASE, JOB, RUN),
        (7_000, "failed", "=0", "=", "=" + "é" * OUTPUT_LIMIT, "=60", "backup"),
    )
    assert isinstance(second, Script)
    assert second.args == (7_000, "succeeded", "", "", "", "", "backup")


@pytest.mark.parametrize(("reply", "inserted"), [(1, True), (0, False)])
def test_record_inserts_a_final_row_on_the_run_and_job_rows_and_the_index(
    reply: int, inserted: bool
) -> None:
    execute = FakeExecute(reply, reply)

    assert (
        drive(REDIS.run_record(NS, "backup", 1_000, "missed", "late", "schedule"), execute)
        is inserted
    )
    drive(REDIS.run_record(NS, "backup", 1_000, "skipped", None, "schedule"), execute)
    assert execute.statements == [
        Script("run_record", (JOB, RUN, SLOTS), (1_000, "missed", "=late", "schedule", "backup")),
        Script("run_record", (JOB, RUN, SLOTS), (1_000, "skipped", "", "schedule", "backup")),
    ]


def test_a_backfill_is_one_script_call_on_the_slot_index_with_each_slot_once_in_order() -> None:
    execute = FakeExecute(2)

    assert drive(REDIS.run_backfill(NS, "backup", [3_000, 1_000, 3_000, 2_000]), execute) == 2
    assert drive(REDIS.run_backfill(NS, "backup", []), execute) == 0
    assert execute.statements == [
        Script("run_backfill", (SLOTS,), ("backup", 1_000, 2_000, 3_000)),
    ]


def test_cancel_and_get_are_one_script_each() -> None:
    execute = FakeExecute(2, 1, run_reply(), None)

    assert drive(REDIS.run_cancel(NS, "backup"), execute) == 2
    assert drive(REDIS.run_cancel(NS, "backup", 1_000, "cancelled by ops\x00"), execute) == 1
    assert drive(REDIS.run_get(NS, "backup", 1_000), execute) == RUNNING
    assert drive(REDIS.run_get(NS, "backup", 1_000), execute) is None
    assert execute.statements[:3] == [
        Script("run_cancel", (SLOTS,), ("", "")),
        Script("run_cancel", (SLOTS,), ("=1000", "=cancelled by ops\ufffd")),
        Script("run_get", (RUN,), ()),
    ]


def test_list_of_one_job_reads_its_slot_index() -> None:
    execute = FakeExecute([run_reply(slot=3), run_reply(slot=2)])

    listed = drive(REDIS.run_list(NS, "backup", 2), execute)

    assert [run.slot_us for run in listed] == [3, 2]
    assert execute.statements == [Script("run_list", (SLOTS,), (2,))]


def test_list_of_every_job_scans_slot_indexes_then_merges_newest_slot_first() -> None:
    # The slot indexes, not the job rows: a deleted job's runs are still listed.
    jobs = [slots_key(NS, "b"), slots_key(NS, "a")]
    execute = FakeExecute(
        jobs,
        [
            [run_reply("b", 5), run_reply("b", 3), run_reply("b", 1)],
            [run_reply("a", 5), run_reply("a", 4), run_reply("a", 2)],
        ],
    )

    listed = drive(REDIS.run_list(NS, None, 4), execute)

    assert [(run.job, run.slot_us) for run in listed] == [("a", 5), ("b", 5), ("a", 4), ("b", 3)]
    assert execute.statements == [
        KeyScan(slots_pattern(NS)),
        fan_out("run_list", (slots_key(NS, "b"), slots_key(NS, "a")), (4,)),
    ]


def test_a_list_of_no_rows_asks_nothing() -> None:
    execute = FakeExecute()

    assert drive(REDIS.run_list(NS, None, 0), execute) == []
    assert execute.statements == []


def test_due_rows_of_named_jobs_read_their_slot_indexes_without_a_scan() -> None:
    execute = FakeExecute([[run_reply("b", 2_000)], [run_reply("a", 1_000)]])

    due = drive(REDIS.run_due(NS, 5, ["b", "a"]), execute)

    assert [(r.job, r.slot_us) for r in due] == [("a", 1_000), ("b", 2_000)]
    assert execute.statements == [
        fan_out("run_due", (slots_key(NS, "b"), slots_key(NS, "a")), (5,))
    ]
    assert drive(REDIS.run_due(NS, 5, []), execute) == []
    assert len(execute.statements) == 1


def test_prune_scans_slot_indexes_then_prunes_each_job_and_adds_up() -> None:
    jobs = [slots_key(NS, "a"), slots_key(NS, "b")]
    execute = FakeExecute(jobs, [2, 0])

    assert drive(REDIS.run_prune(NS, 10, 3_600_000_000), execute) == 2
    assert execute.statements[0] == KeyScan(slots_pattern(NS))
    assert execute.statements[1] == fan_out(
        "run_prune", (slots_key(NS, "a"), slots_key(NS, "b")), (10, 3_600_000_000)
    )


# -- jobs and the clock ------------------------------------------------------------------------
def test_register_is_one_pipeline_of_calls_returning_each_row_as_it_was_before() -> None:
    execute = FakeExecute([False], [JOB_REPLY, False])

    assert drive(REDIS.job_register(NS, [("backup", "{}", "fp0")]), execute) == [None]
    registered = [("backup", "{}", "fp1"), ("report", '{"every": "1m"}', "fp2")]
    assert drive(REDIS.job_register(NS, registered), execute) == [JOB_ROW, None]
    assert execute.statements[1] == ScriptCalls(
        "job_register",
        (
            ((JOB,), ("backup", "{}", "fp1")),
            ((job_key(NS, "report"),), ("report", '{"every": "1m"}', "fp2")),
        ),
    )
    assert drive(REDIS.job_register(NS, []), execute) == []
    assert len(execute.statements) == 2, "nothing to register: no round trip"


@pytest.mark.parametrize(("paused", "flag"), [(True, 1), (False, 0)])
def test_set_paused_reports_an_unknown_job(paused: bool, flag: int) -> None:
    execute = FakeExecute(1, 0)

    assert drive(REDIS.job_set_paused(NS, "backup", paused), execute) is True
    assert drive(REDIS.job_set_paused(NS, "backup", paused), execute) is False
    # The slot index: a resumed row holding only a pause recorded ahead goes if it is empty.
    assert execute.statements[0] == Script("job_set_paused", (JOB, SLOTS), (flag, "backup"))


def test_job_get_and_list() -> None:
    paused = job_reply(
        job=b"alpha",
        paused=b"1",
        definition=b"{}",
        fingerprint=b"",
        high_water_us=None,
        last_success_us=None,
        last_failure_us=None,
        updated_us=b"1",
        now_us=b"2",
    )
    execute = FakeExecute(JOB_REPLY, None, [JOB, job_key(NS, "alpha")], [JOB_REPLY, paused])

    assert drive(REDIS.job_get(NS, "backup"), execute) == JOB_ROW
    assert drive(REDIS.job_get(NS, "backup"), execute) is None
    listed = drive(REDIS.job_list(NS), execute)

    assert [(job.job, job.paused, job.high_water_us) for job in listed] == [
        ("alpha", True, None),
        ("backup", False, 1_000),
    ]
    assert execute.statements[2:] == [
        KeyScan(jobs_pattern(NS)),
        fan_out("job_get", (JOB, job_key(NS, "alpha")), ()),
    ]


def test_store_now_is_the_servers_time() -> None:
    execute = FakeExecute(b"1700000000123456")

    assert drive(REDIS.store_now(), execute) == 1_700_000_000_123_456
    assert execute.statements == [Script("store_now")]


def test_lease_listing_skips_the_ledger_keys_of_the_namespace() -> None:
    keys = [LEASE, JOB, RUN, SLOTS, lease_key(NS, "other")]
    execute = FakeExecute(keys, [None, None], keys, [False, False])

    drive(REDIS.lease_list(NS), execute)
    drive(REDIS.lease_prune(NS, 1, True), execute)

    assert execute.statements[0] == KeyScan(namespace_pattern(NS))
    leases = (LEASE, lease_key(NS, "other"))
    assert execute.statements[1] == fan_out("lease_get", leases)
    assert execute.statements[3] == fan_out("lease_prune", leases, (1, 1))


def test_every_ledger_statement_is_a_script_or_a_scan() -> None:
    execute = FakeExecute(
        [[b"taken"]],  # run_claim
        [],  # run_list of a job
        [],  # job_list: scan
        [],  # job_list: job_get[]
        None,  # job_get
        None,  # run_get
        None,  # run_extend
        0,  # run_finish
        0,  # run_record
        0,  # run_cancel
        [],  # run_list: scan
        [],  # run_list: run_list[]
        0,  # job_set_paused
        [],  # run_prune: scan
        [],  # run_prune: run_prune[]
        [None],  # job_register
        b"1",  # store_now
        [0],  # run_settled[]
    )
    drive(REDIS.run_claim(NS, [SlotClaim(job="j", slot_us=1, run_id="r")], "h", 1), execute)
    drive(REDIS.run_list(NS, "j", 1), execute)
    drive(REDIS.job_list(NS), execute)
    drive(REDIS.job_get(NS, "j"), execute)
    drive(REDIS.run_get(NS, "j", 1), execute)
    drive(REDIS.run_extend(NS, "j", 1, 1, 1), execute)
    drive(REDIS.run_finish(NS, "j", 1, 1, RunOutcome(state="succeeded")), execute)
    drive(REDIS.run_record(NS, "j", 1, "missed", None, "schedule"), execute)
    drive(REDIS.run_cancel(NS, "j"), execute)
    drive(REDIS.run_list(NS, None, 1), execute)
    drive(REDIS.job_set_paused(NS, "j", True), execute)
    drive(REDIS.run_prune(NS, 1, 1), execute)
    drive(REDIS.job_register(NS, [("j", "{}", "")]), execute)
    drive(REDIS.store_now(), execute)
    drive(REDIS.run_settled(NS, [("j", 1)]), execute)

    assert len(execute.names) == 18
    for name in execute.names:
        assert name == "scan" or name in SCRIPTS, name


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_documents_its_keys_arguments_and_reply(name: str) -> None:
    body = SCRIPT_BLOCKS[name].text
    header = "\n".join(re.findall(r"^--.*$", body.split("\nlocal")[0].split("\nif")[0], re.M))
    assert "KEYS" in header, name
    assert "returns" in header, name
    if "ARGV[" in body:
        assert "ARGV" in header, name


# -- the runner's pipeline ---------------------------------------------------------------------
def test_a_fan_out_is_one_call_per_key_with_the_same_arguments() -> None:
    assert fan_out("job_get", ("a", "b"), (9,)) == ScriptCalls(
        "job_get", ((("a",), (9,)), (("b",), (9,)))
    )


class FakePipeline:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.queued: list[tuple[Any, ...]] = []

    def __enter__(self) -> FakePipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute_command(self, command: str, sha: str, numkeys: int, *keys_and_args: Any) -> None:
        assert command == "EVALSHA"
        self.queued.append((sha, numkeys, *keys_and_args))

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        assert raise_on_error is False
        self.client.round_trips.append(self.queued)
        return [
            redis.exceptions.NoScriptError("NOSCRIPT")
            if sha not in self.client.loaded
            else self.client.reply(args)
            for sha, _, *args in self.queued
        ]


class FakeClient:
    def __init__(self, loaded: set[str], reply: Any = lambda args: args) -> None:
        self.loaded = loaded
        self.reply = reply
        self.round_trips: list[list[tuple[Any, ...]]] = []

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        assert transaction is False
        return FakePipeline(self)

    def script_load(self, script: str) -> str:
        self.loaded.add("sha-of-" + script)
        return "sha-of-" + script


class FakeScript:
    def __init__(self, sha: str, script: str) -> None:
        self.sha, self.script = sha, script


def _store(client: FakeClient, script: FakeScript) -> RedisStore:
    store = object.__new__(RedisStore)
    store._client = client  # type: ignore[assignment]
    store._scripts = {"run_claim": script}  # type: ignore[dict-item]
    return store


def test_a_batch_is_one_pipeline_of_evalsha_calls_each_with_its_keys_and_arguments() -> None:
    client = FakeClient({"sha"})
    store = _store(client, FakeScript("sha", "lua"))
    statement = ScriptCalls("run_claim", ((("k1", "k2"), (1,)), (("k3",), ("x",))))

    assert store._execute(statement) == [["k1", "k2", 1], ["k3", "x"]]
    assert client.round_trips == [[("sha", 2, "k1", "k2", 1), ("sha", 1, "k3", "x")]]


def test_calls_refused_for_an_unknown_script_are_sent_again_after_loading_it() -> None:
    client = FakeClient(set())
    script = FakeScript("stale", "lua")
    store = _store(client, script)
    statement = fan_out("run_claim", ("a", "b"), (1,))

    assert store._execute(statement) == [["a", 1], ["b", 1]]
    assert len(client.round_trips) == 2
    assert script.sha == "sha-of-lua"


def test_an_error_reply_in_a_batch_is_raised() -> None:
    def reply(args: list[Any]) -> Any:
        return redis.exceptions.ResponseError("boom") if args[0] == "b" else 1

    store = _store(FakeClient({"sha"}, reply), FakeScript("sha", "lua"))

    with pytest.raises(redis.exceptions.ResponseError, match="boom"):
        store._execute(fan_out("run_claim", ("a", "b"), ()))


def test_an_empty_batch_sends_nothing() -> None:
    client = FakeClient({"sha"})
    store = _store(client, FakeScript("sha", "lua"))

    assert store._execute(fan_out("run_claim", (), ())) == []
    assert client.round_trips == []
