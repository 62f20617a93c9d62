"""A cancel request stops a running attempt within about a second, whatever its lease.

Real processes on every backend shared across processes: the attempt is a command run by
``fleetcron exec --schedule`` with ``--lock-at-most 10m`` (its renewals come every 200 s),
and the request is the flag on its ledger row.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, read_when_written
from fleetcron.stores import open_store, parse_store_url

BOUND_S = 5.0
"""How long the stop may take after the request: about a second, bounded for a loaded
machine."""


@CROSS_PROCESS_BACKENDS
def test_a_cancel_request_stops_an_exec_run_within_about_a_second(cli: Cli, tmp_path: Path) -> None:
    started = tmp_path / "started"
    holder = cli.spawn(
        "exec",
        "report",
        "--schedule",
        "0 0 1 1 *",
        "--lock-at-most",
        "10m",
        "--",
        "sh",
        "-c",
        'echo up > "$0"; exec sleep 120',
        str(started),
    )
    read_when_written(started, timeout=30)
    store = open_store(parse_store_url(cli.backend))
    try:
        asked = store.run(store.ops.run_cancel(cli.namespace, "report"))
    finally:
        store.close()
    assert asked == 1
    at = time.monotonic()
    result = holder.wait(timeout=60)
    took = time.monotonic() - at

    assert took < BOUND_S, took
    assert result.returncode != 0
    (run,) = json.loads(cli.run("runs", "report", "--json").stdout)
    assert (run["state"], run["error"]) == ("cancelled", "cancel requested"), run
