"""At most one holder at a time, under real contention: 8 processes (threads for memory)."""

from __future__ import annotations

import itertools
import sys
import threading
from pathlib import Path

from contract.contract_support import run_together
from contract.lockworker import contend
from fleetcron import Fleet
from fleetcron.stores.memory import MemoryStore

CONTENDERS = 8
ATTEMPTS = 20
WORKER = Path(__file__).with_name("lockworker.py")


def _run_processes(url: str, namespace: str, counter: Path) -> list[dict[str, object]]:
    command = [sys.executable, str(WORKER), url, namespace, "shared", str(counter), str(ATTEMPTS)]
    return run_together([command] * CONTENDERS, "contender")


def _run_threads(namespace: str, counter: Path) -> list[dict[str, object]]:
    store = MemoryStore()
    start = threading.Barrier(CONTENDERS)
    results: list[dict[str, object]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            fleet = Fleet(store, namespace=namespace)
            start.wait(timeout=10)
            results.append(contend(fleet, "shared", counter, ATTEMPTS))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(CONTENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def test_competing_processes_never_hold_one_name_at_once_and_fences_follow_grant_order(
    backend_url: str, namespace: str, tmp_path: Path
) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")

    if backend_url.startswith("memory://"):
        results = _run_threads(namespace, counter)
    else:
        results = _run_processes(backend_url, namespace, counter)

    grants = sorted(
        (seen, fence)
        for result in results
        for seen, fence in result["grants"]  # type: ignore[attr-defined]
    )
    refused = sum(int(result["refused"]) for result in results)  # type: ignore[call-overload]
    assert len(results) == CONTENDERS
    assert len(grants) + refused == CONTENDERS * ATTEMPTS
    assert refused > 0, "no contention happened; the test proved nothing"
    assert len(grants) >= CONTENDERS, "too few grants to be meaningful"
    # Each grant saw the count of grants before it: no lost update, no double read.
    assert int(counter.read_text()) == len(grants)
    assert [seen for seen, _ in grants] == list(range(len(grants)))
    # In grant order (the counter value seen under the lock) fences strictly increase.
    fences = [fence for _, fence in grants]
    assert all(a < b for a, b in itertools.pairwise(fences)), fences
