"""bench/capacity.py counts what it reports: the job mix, the slots run once, twice or
never, and store operations per run, from synthetic worker reports and ledger rows (the
harness itself needs a PostgreSQL server and minutes; these checks need neither)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_capacity", BENCH / "capacity.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


capacity = _load()


def _args(**overrides: Any) -> argparse.Namespace:
    args: argparse.Namespace = capacity.parse_args(["--jobs", "200", "--every-scale", "30"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_the_job_mix_has_the_asked_shares_spread_over_the_names() -> None:
    kinds = capacity.job_kinds(_args(jobs=1000, cron_share=0.05, fast_share=0.01))
    assert kinds.count("cron") == 50
    assert kinds.count("fast") == 10
    assert kinds.count("slow") == 940
    assert "cron" in kinds[:100]
    assert "cron" in kinds[-100:]


def test_scaled_intervals_and_the_cron_burst_at_every_minute() -> None:
    args = _args()
    specs = {s.name: s for s in capacity.job_specs(args)}
    kinds = capacity.job_kinds(args)
    every: dict[str, set[object]] = {kind: set() for kind in ("slow", "fast", "cron")}
    for i, kind in enumerate(kinds):
        schedule = specs[capacity.job_name(i)].schedule
        every[kind].add(getattr(schedule, "every_us", None) or schedule.expression)
    assert every == {"slow": {10_000_000}, "fast": {2_000_000}, "cron": {"* * * * *"}}
    unscaled = capacity.job_options("cron", _args(every_scale=1.0))
    assert unscaled == {"schedule": "*/5 * * * *"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "10,x"], "--replicas"),
        (["--replicas", "0"], "--replicas"),
        (["--jitter", "1.5"], "--jitter"),
        (["--cron-share", "0.7", "--fast-share", "0.5"], "--cron-share"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        capacity.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def _row(job: str, slot: int, state: str = "succeeded", started: int | None = None) -> Any:
    return SimpleNamespace(
        job=job, slot_us=slot, state=state, started_us=started or slot + 5_000, holder="h0"
    )


def _server(xact: int, read: int, cpu: float) -> dict[str, Any]:
    return {
        "xact_commit": xact,
        "seq_tup_read": 0,
        "idx_tup_fetch": read,
        "tup_written": 0,
        "rows_read_by_table": {"fleetcron_run": read},
        "backend_cpu": {"1": cpu},
    }


def test_summary_counts_slots_once_twice_never_and_operations_per_run() -> None:
    args = _args(jobs=2, cron_share=0.0, fast_share=0.0, every_scale=30.0)  # every 10 s
    start_us = 1_800_000_000_000_000  # a multiple of 10 s
    window = {
        "start_us": start_us,
        "end_us": start_us + 42_000_000,
        "wall_start": 1000.0,
        "wall_end": 1042.0,
        "server_start": _server(100, 0, 1.0),
        "server_end": _server(124, 240, 1.5),
        "client_cpu_start": 0.0,
        "client_cpu_end": 2.0,
        "rss_mb": [50.0],
    }
    slots = [start_us + k * 10_000_000 for k in (1, 2, 3, 4)]  # fire times in the window
    rows = [_row("job-000000", s) for s in slots]
    rows += [_row("job-000001", s) for s in slots[:3]]
    rows.append(_row("job-000001", slots[3], state="missed"))
    executed = [[r.job, r.slot_us] for r in rows if r.state == "succeeded"]
    executed.append(["job-000000", slots[0]])  # one slot's function ran twice
    report = {
        "holders": {"h0": 0},
        "executed": executed,
        "ops": {"1010": {"run_claim": 40, "store_now": 40}, "2000": {"run_claim": 999}},
        "ops_per_replica": [80],
        "loop_lags": [[1010.0, 2.0]],
    }
    s = capacity.summarise(args, 1, window, rows, [report])["summary"]
    assert (s["slots"], s["runs"]) == (8, 7)
    assert (s["slots_run_once"], s["slots_run_twice"], s["slots_never_run"]) == (6, 1, 1)
    assert s["slots_missed"] == 1
    assert s["lag_ms_p50"] == pytest.approx(5.0)
    # 80 operations counted in the window's whole seconds 1001..1041 (the second 2000 is
    # outside it), against 7 runs over the 40 s between start + 1 s and end - 1 s
    runs_per_s = 7 / 40
    assert s["store_ops_per_s"] == pytest.approx(80 / 41)
    assert s["store_ops_per_run"] == pytest.approx(80 / 41 / runs_per_s)
    assert s["store_ops_per_run_by_name"]["store_now"] == pytest.approx(40 / 41 / runs_per_s)
    runs_in_server_span = runs_per_s * 42
    assert s["xact_commit_per_run"] == pytest.approx(24 / runs_in_server_span)
    assert s["rows_read_per_run"] == pytest.approx(240 / runs_in_server_span)
    assert s["server_cpu_ms_per_run"] == pytest.approx(500 / runs_in_server_span)


def test_the_pool_lends_each_connection_to_one_operation_at_a_time() -> None:
    class Store:
        def __init__(self) -> None:
            self.busy = False
            self.calls = 0

        async def run(self, operation: Any) -> Any:
            assert not self.busy
            self.busy = True
            await asyncio.sleep(0)
            self.busy = False
            self.calls += 1
            return operation

    async def main() -> list[Any]:
        stores = [Store(), Store()]
        pool = capacity.Pool(stores)
        answers = await asyncio.gather(*(pool.run(i) for i in range(10)))
        assert sum(s.calls for s in stores) == 10
        return list(answers)

    assert asyncio.run(main()) == list(range(10))
