"""One replica of the exactly-once ledger test: it claims every slot it can and runs it.

Run as a script it is one process: it connects, prints ``ready``, waits for a line on
stdin (the start signal, so all replicas start together), works, and prints what it ran as
JSON. The in-memory backend, which is one process, uses :func:`work` from threads instead.

Each round it asks for *all* the slots at once (in its own shuffled order, as replicas
whose job lists differ in order would), finishes what it was given as ``succeeded``, and
stops once the ledger shows every slot finished.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from fleetcron.models import RunFinish, RunOutcome, SlotClaim
from fleetcron.stores import SyncStore, open_store, parse_store_url

TTL_US = 30_000_000  # never expires during the test: every claim is finished by its holder
GIVE_UP_S = 45.0


def work(
    store: SyncStore, namespace: str, slots: list[tuple[str, int, bool]], holder: str, seed: int
) -> dict[str, Any]:
    """Claim and finish until every slot of ``slots`` (job, slot_us, exclusive) is final.

    Returns ``{"holder": holder, "runs": [[job, slot_us, fence, attempt, finished], …],
    "rounds": n, "empty_rounds": n}``; ``finished`` is what ``run_finish_many`` answered.
    """
    ops = store.ops
    rng = random.Random(seed)
    claims = [
        SlotClaim(job=job, slot_us=slot, run_id=f"{holder}/{job}/{slot}", exclusive=exclusive)
        for job, slot, exclusive in slots
    ]
    runs: list[list[Any]] = []
    rounds = empty_rounds = 0
    give_up = time.monotonic() + GIVE_UP_S
    while True:
        assert time.monotonic() < give_up, f"{holder}: the slots were not all finished in time"
        rng.shuffle(claims)
        rounds += 1
        answers = store.run(ops.run_claim(namespace, claims, holder, TTL_US))
        claimed = [answer.run for answer in answers if answer.run is not None]
        # "Run" the jobs (giving the others a chance to try the same slots), then record
        # every outcome in one batch, as a replica does with the runs that end together.
        time.sleep(0.0005 * len(claimed))
        finishes = [
            RunFinish(run.job, run.slot_us, run.fence, RunOutcome(state="succeeded"))
            for run in claimed
        ]
        answered = store.run(ops.run_finish_many(namespace, finishes)) if finishes else []
        for run, finished in zip(claimed, answered, strict=True):
            runs.append([run.job, run.slot_us, run.fence, run.attempt, finished])
        if claimed:
            continue
        empty_rounds += 1
        rows = store.run(ops.run_list(namespace, None, len(claims) + 10))
        if len(rows) >= len(claims) and all(row.state != "running" for row in rows):
            return {
                "holder": holder,
                "runs": runs,
                "rounds": rounds,
                "empty_rounds": empty_rounds,
            }
        time.sleep(0.001)


def main(url: str, namespace: str, holder: str, seed: str, slots: str) -> None:
    store = open_store(parse_store_url(url))
    try:
        # A first round trip before "ready", so connecting is not part of the race.
        store.run(store.ops.store_now())
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        wanted = [
            (str(job), int(slot), bool(exclusive)) for job, slot, exclusive in json.loads(slots)
        ]
        result = work(store, namespace, wanted, holder, int(seed))
    finally:
        store.close()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
