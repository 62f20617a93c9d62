"""examples/invoices.py end to end, on every backend: run twice, each customer has one
invoice per period; a worker that outlived its claim writes nothing."""

from __future__ import annotations

import importlib.util
import sqlite3
import time
from pathlib import Path
from types import ModuleType

import pytest

from fleetcron import Fleet
from fleetcron.fencing import StaleFence

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "invoices.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("invoices_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def invoices(path: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(path) as conn:
        return sorted(conn.execute("SELECT customer, period, amount_cents FROM invoices"))


def test_running_the_invoice_job_again_invoices_no_one_twice(
    tmp_path: Path, backend_url: str, monkeypatch: pytest.MonkeyPatch, namespace: str
) -> None:
    invoices_example = example()
    monkeypatch.setenv("FLEETCRON_BACKEND", backend_url)
    monkeypatch.setattr(invoices_example, "NAMESPACE", namespace)
    demo = tmp_path / "demo"

    for period in ("2026-10", "2026-10", "2026-11", "2026-10"):
        invoices_example.main(["--period", period, "--dir", str(demo)])

    got = invoices(demo / "app.db")
    expected = sorted(
        (customer, period, cents)
        for customer, cents in invoices_example.CUSTOMERS.items()
        for period in ("2026-10", "2026-11")
    )
    assert got == expected


def test_a_worker_that_outlived_its_claim_is_refused_by_the_fence(
    tmp_path: Path, backend_url: str, namespace: str
) -> None:
    invoices_example = example()
    conn = invoices_example.app_database(tmp_path / "app.db")
    with Fleet(backend_url, namespace=namespace) as fleet:
        queue = fleet.queue("invoices")
        queue.put({"customer": "cust-4211", "period": "2026-10"})
        (stale,) = queue.claim(visibility="200ms")
        # Paused past its claim: the item is delivered again, to a live worker.
        give_up = time.monotonic() + 30
        while not (fresh := queue.claim(visibility="1m")):  # on the store's clock
            assert time.monotonic() < give_up, "the stale claim never expired"
            time.sleep(0.01)
        (live,) = fresh
        assert live.fence > stale.fence

        invoices_example.invoice(conn, live)
        assert queue.ack(live) == [True]
        with pytest.raises(StaleFence):
            invoices_example.invoice(conn, stale)  # it wakes and tries: refused, rolled back

        assert queue.ack(stale) == [False]
    assert invoices(tmp_path / "app.db") == [("cust-4211", "2026-10", 129_900)]
