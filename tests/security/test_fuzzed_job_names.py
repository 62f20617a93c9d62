"""Job names full of metacharacters through the run ledger of every backend: registering,
pausing, queueing (``trigger``), finding due runs, claiming, finishing, listing and
reading back each give the very job — never a lookalike registered beside it (other case,
accents, NFKC, ``%``/``_``, hash tags…), whose rows, pause flag and job lease stay its own.

The names are what ``fleetcron exec --schedule NAME`` accepts, less those whose job lease
name would be too long (``test_known_bug_job_lease_name.py``).
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from fleetcron.models import RunOutcome, SlotClaim, job_lease_name
from fleetcron.stores import SyncStore
from security.fuzzing import budget, fuzz, job_names, lookalikes, name_problems, nfc, unique_base

S = 1_000_000
DEFINITION = json.dumps({"schedule": {"kind": "every", "every_us": 60 * S}, "timezone": "UTC"})
HOLDER = "fuzz-host:4242:0123456789abcdef0123"
MAX_JOBS = 10


@st.composite
def _jobs(draw: st.DrawFn) -> list[str]:
    """Distinct job names (NFC): drawn ones and their valid lookalikes."""
    found: dict[str, None] = {}
    for job in draw(st.lists(job_names(), min_size=1, max_size=3)):
        for form in (job, *lookalikes(job)):
            normal = nfc(form)
            if not name_problems(normal) and not name_problems(job_lease_name(normal)):
                found.setdefault(normal, None)
    return list(found)[:MAX_JOBS]


def _check_ledger(store: SyncStore, jobs: list[str], paused_index: int) -> None:
    ops = store.ops
    ns = unique_base()
    fingerprints = {job: f"{i:032x}" for i, job in enumerate(jobs)}
    paused = jobs[paused_index % len(jobs)]

    assert store.run(ops.job_register(ns, [(j, DEFINITION, fingerprints[j]) for j in jobs])) == [
        None
    ] * len(jobs)
    for job in jobs:
        record = store.run(ops.job_get(ns, job))
        assert record is not None, job
        assert (record.job, record.fingerprint) == (job, fingerprints[job])
    assert store.run(ops.job_set_paused(ns, paused, True))
    listed = store.run(ops.job_list(ns))
    assert [record.job for record in listed] == sorted(jobs)
    assert {record.job: record.paused for record in listed} == {j: j == paused for j in jobs}

    now = store.run(ops.store_now())
    queued_slot = now - now % S - 10 * S
    claimed_slot = queued_slot - 60 * S
    for job in jobs:
        assert store.run(ops.run_record(ns, job, queued_slot, "queued", None, "manual")), job
    for subset in (jobs[:1], jobs[1::2], jobs):
        due = store.run(ops.run_due(ns, 100, subset))
        assert sorted((run.job, run.slot_us, run.state) for run in due) == sorted(
            (job, queued_slot, "queued") for job in subset
        )

    claims = [
        SlotClaim(job=job, slot_us=claimed_slot, run_id=f"run-{i}", trigger="manual")
        for i, job in enumerate(jobs)
    ]
    answers = store.run(ops.run_claim(ns, claims, HOLDER, 60 * S))
    assert [(a.job, a.slot_us, a.status) for a in answers] == [
        (job, claimed_slot, "claimed") for job in jobs
    ]
    leases = store.run(ops.lease_list(ns))
    assert [lease.name for lease in leases] == sorted(job_lease_name(job) for job in jobs)
    assert all(lease.held and lease.holder == HOLDER for lease in leases)
    for answer in answers:
        assert answer.run is not None
        assert answer.run.job == answer.job
        outcome = RunOutcome(state="succeeded", exit_code=0, output=f"ran {answer.job}")
        assert store.run(ops.run_finish(ns, answer.job, claimed_slot, answer.run.fence, outcome))

    pairs = [(job, slot) for job in jobs for slot in (claimed_slot, queued_slot)]
    assert store.run(ops.run_settled(ns, pairs)) == {(job, claimed_slot) for job in jobs}
    for job in jobs:
        rows = store.run(ops.run_list(ns, job, 10))
        assert [(r.job, r.slot_us, r.state) for r in rows] == [
            (job, queued_slot, "queued"),
            (job, claimed_slot, "succeeded"),
        ]
        done = store.run(ops.run_get(ns, job, claimed_slot))
        assert done is not None
        assert (done.job, done.output, done.holder) == (job, f"ran {job}", HOLDER)
    assert not any(lease.held for lease in store.run(ops.lease_list(ns)))


def test_fuzzed_job_names_keep_their_own_ledger_rows_pause_flag_and_lease(
    store: SyncStore, backend_url: str
) -> None:
    examples = budget(backend_url, sql=6, fast=20)
    check = given(jobs=_jobs(), paused_index=st.integers(0, MAX_JOBS))(_check_ledger)
    fuzz(examples)(check)(store)
