"""A holder killed with SIGKILL: others skip until its lease expires, then take over.

On the server stores only: on SQLite the store's one host tells a holder gone at once
(tests/e2e/test_exec_takeover_sqlite.py).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from e2e.helpers import Cli, read_when_written, wait_for
from services import STORES

REPORT_AND_SLEEP = 'echo "$$ $FLEETCRON_FENCE" > "$1"; exec sleep 30'
REPORT_FENCE = 'echo "$FLEETCRON_FENCE" > "$1"'
# Long enough that the second exec (a Python start on a loaded machine) surely comes
# before the dead holder's lease ends; the takeover then waits for that end.
LEASE = "5s"


@pytest.mark.parametrize(
    "backend_url", [store for store in STORES if store != "sqlite"], indirect=True
)
def test_after_sigkill_others_skip_until_expiry_then_run_with_a_higher_fence(
    cli: Cli, tmp_path: Path
) -> None:
    holder_file = tmp_path / "holder"
    holder = cli.spawn(
        "exec", "sweep", "--lock-at-most", LEASE, "--",
        "sh", "-c", REPORT_AND_SLEEP, "sh", str(holder_file),
    )  # fmt: skip
    pgid, first_fence = map(int, read_when_written(holder_file).split())
    cli.track_group(pgid)
    row = wait_for(lambda: cli.held("sweep"), what="the lease to show as held")
    assert row["holder"] == f"{socket.gethostname()}:{holder.pid}"
    assert row["fence"] == first_fence

    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    os.killpg(pgid, signal.SIGKILL)  # the command leads its own session

    marker = tmp_path / "marker"
    skipped = cli.run(
        "exec", "sweep", "--lock-at-most", LEASE, "--", "sh", "-c", REPORT_FENCE, "sh", str(marker)
    )
    assert skipped.returncode == 0, skipped.stderr
    assert not marker.exists(), "ran while the dead holder's lease was still valid"
    still = cli.held("sweep")
    assert still is not None, "skip was not before expiry"
    assert still["fence"] == first_fence, "skip was not before expiry"
    # By the store's clock the dead holder's lease ends at most --lock-at-most after its last
    # renewal (a timing bound measured here would only measure how loaded the machine is).
    assert still["expires_in_s"] <= 5.0, "the lease outlives --lock-at-most"

    wait_for(
        lambda: cli.held("sweep") is None, timeout=10, what="the dead holder's lease to expire"
    )
    taken = cli.run(
        "exec", "sweep", "--lock-at-most", LEASE, "--", "sh", "-c", REPORT_FENCE, "sh", str(marker)
    )
    assert taken.returncode == 0, taken.stderr
    assert int(marker.read_text()) > first_fence
