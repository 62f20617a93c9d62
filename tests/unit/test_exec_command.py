"""``fleetcron exec``'s command under the executor's stop sequence, in process on the
memory store: a renewal the store refuses stops the command at once (exit 76), a
signal sent to exec reaches the command's process group whichever of exec's threads the
kernel hands it to, and the command's process group is named to the store (SQLite's
same-host takeover waits for it) before and after it starts. The command-line side (exit
statuses, deadlines, the reaper) is tests/e2e/test_exec_*.py and test_reaper.py.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from fleetcron.cli.exec_command import run_command
from fleetcron.cli.exec_options import ExecOptions, exec_options
from fleetcron.cli.exitcodes import EXIT_LEASE_LOST
from fleetcron.cli.main import build_parser
from fleetcron.errors import StoreUnavailable
from fleetcron.local_holder import PENDING_GROUP
from fleetcron.sync import Fleet
from fleetcron.testing import MemoryStore

NS = "ns"


def _options(*flags: str, command: tuple[str, ...]) -> ExecOptions:
    args = build_parser().parse_args(["exec", "job", *flags])
    return exec_options(args, list(command))


def _wait_for(path: Path, timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < give_up, f"{path} was not written"
        time.sleep(0.01)


def test_a_refused_renewal_stops_the_command_at_once_and_exits_76(tmp_path: Path) -> None:
    store = MemoryStore()
    term = tmp_path / "term"
    script = f'trap "echo term > {term}; exit 7" TERM; while :; do sleep 0.05; done'
    options = _options("--lock-at-most", "6s", command=("sh", "-c", script))
    with Fleet(store, namespace=NS) as fleet:
        lease = fleet.try_lock("job", lock_at_most="6s")
        assert lease is not None
        # Another holder has the lease by the first renewal (2 s in): it is refused.
        assert store.run(store.ops.lease_release(NS, "job", lease.holder, lease.fence))
        assert store.run(store.ops.lease_acquire(NS, "job", "other:1:x", 60_000_000, 0))
        started = time.monotonic()
        status = run_command(lease, options, None, run_id=str(uuid.uuid4()))
        elapsed = time.monotonic() - started
        lease.release()

    assert status == EXIT_LEASE_LOST
    assert term.read_text() == "term\n"  # a SIGTERM first: the command's own way out
    # At the refusal, not at the deadline's stop point (6 s − 0.6 s margin − 1 s grace).
    assert elapsed < 4.0, elapsed


def test_a_signal_to_exec_reaches_the_command_from_any_thread(tmp_path: Path) -> None:
    store = MemoryStore()
    ready = tmp_path / "ready"
    # Ends by itself after ~10 s with status 0; SIGTERM makes it 42.
    script = (
        f'trap "exit 42" TERM; echo > {ready}; i=0; '
        'while [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done'
    )
    options = _options(command=("sh", "-c", script))

    def send() -> None:
        _wait_for(ready)
        # To this thread, not to the main one, which waits in its event loop with no stop
        # point due for minutes.
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with Fleet(store, namespace=NS) as fleet:
        lease = fleet.try_lock("job")
        assert lease is not None
        sender = threading.Thread(target=send)
        sender.start()
        try:
            status = run_command(lease, options, None, run_id=str(uuid.uuid4()))
        finally:
            sender.join()
            lease.release()

    assert status == 42
    assert signal.getsignal(signal.SIGTERM) is before  # the handler found is back


class _GroupNames:
    """Stands in for SQLite's ``lease_group``: notes each group named, and whether the
    command had run by then; raises ``fail`` for the ``fail_at``-th call."""

    def __init__(self, ran: Path, fail_at: int | None = None) -> None:
        self.ran = ran
        self.fail_at = fail_at
        self.named: list[tuple[int, bool]] = []

    def __call__(self, group: int) -> bool:
        self.named.append((group, self.ran.exists()))
        if self.fail_at == len(self.named):
            raise StoreUnavailable("the store is busy")
        return True


def _run_naming(tmp_path: Path, names: _GroupNames) -> int:
    script = f'echo "$$" > {names.ran}'
    options = _options(command=("sh", "-c", script))
    with Fleet(MemoryStore(), namespace=NS) as fleet:
        lease = fleet.try_lock("job")
        assert lease is not None
        try:
            return run_command(lease, options, None, run_id=str(uuid.uuid4()), name_group=names)
        finally:
            lease.release()


def test_the_commands_group_is_named_pending_before_it_starts_then_by_its_leader(
    tmp_path: Path,
) -> None:
    names = _GroupNames(tmp_path / "ran")

    assert _run_naming(tmp_path, names) == 0

    leader = int(names.ran.read_text())  # the command leads a session of its own
    assert names.named[0] == (PENDING_GROUP, False)
    assert [group for group, _ in names.named] == [PENDING_GROUP, leader]


def test_a_store_error_naming_the_pending_group_starts_no_command(tmp_path: Path) -> None:
    names = _GroupNames(tmp_path / "ran", fail_at=1)

    with pytest.raises(StoreUnavailable):
        _run_naming(tmp_path, names)

    assert not names.ran.exists()


def test_a_store_error_naming_the_started_group_is_logged_and_the_command_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = _GroupNames(tmp_path / "ran", fail_at=2)

    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        assert _run_naming(tmp_path, names) == 0

    assert names.ran.exists()
    assert [getattr(r, "action", None) for r in caplog.records] == ["lease_group_failed"]
