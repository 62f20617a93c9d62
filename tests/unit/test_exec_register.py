"""``fleetcron exec --schedule`` registers the job's definition before each claim.

In process, on the memory store and a fake clock: the definition it amounts to, a
definition registered by somebody else between the register and the claim (a skip with
a warning, nothing run), and a row kept fresh for ``prune --jobs`` by invocations that
were all skipped. The end-to-end side (``status`` on every backend, the replaced
definition's warning) is tests/e2e/test_exec_schedule.py.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetcron.cli.exec import ExecOptions, exec_job_spec, exec_options, run_exec_schedule
from fleetcron.cli.main import build_parser
from fleetcron.errors import ConfigurationError
from fleetcron.job_options import job_spec
from fleetcron.lease import new_holder
from fleetcron.lock_terms import lease_terms
from fleetcron.models import SlotClaim
from fleetcron.schedules import CronSchedule
from fleetcron.stores.base import Operation
from fleetcron.sync import Fleet
from fleetcron.testing import FakeClock, MemoryStore

NS = "ns"
DAY_US = 86_400_000_000
# 20 s past a minute: no exec here waits for an imminent slot.
START_US = 1_700_000_000_000_000


def _options(*flags: str, command: tuple[str, ...] = ("true",)) -> ExecOptions:
    args = build_parser().parse_args(["exec", "report", *flags])
    return exec_options(args, list(command))


def _spec_of(options: ExecOptions, schedule: CronSchedule, url: str | None = None) -> Any:
    terms = lease_terms(
        NS,
        options.name,
        lock_at_most=options.lock_at_most,
        lock_at_least=options.lock_at_least,
        keepalive=options.keepalive,
    )
    return exec_job_spec(options, schedule, terms, url)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """The ``fleetcron`` logger's records (collected on the logger itself: the CLI's
    logging set-up, run by other tests of this process, stops it propagating)."""
    logger = logging.getLogger("fleetcron")
    handler = _Collect()
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def test_the_definition_is_the_one_an_equivalent_jobs_file_job_has() -> None:
    flags = (
        "--schedule",
        "30 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--lock-at-most",
        "2h",
        "--lock-at-least",
        "1m",
        "--timeout",
        "90m",
        "--grace",
        "15m",
        "--stuck-after",
        "3h",
        "--ping-url",
        "https://hc-ping.example/abc",
    )
    options = _options(*flags, command=("/opt/report.sh", "--full"))
    spec = _spec_of(options, CronSchedule("30 2 * * *", "Europe/Berlin"))

    equivalent = job_spec(
        "report",
        where="test",
        schedule="30 2 * * *",
        timezone="Europe/Berlin",
        command=["/opt/report.sh", "--full"],
        lock_at_most="2h",
        lock_at_least="1m",
        timeout="90m",
        grace="15m",
        stuck_after="3h",
        ping_url="https://hc-ping.example/abc",
        overlap="skip",
        catchup="skip",
    )
    assert spec.definition() == equivalent.definition()
    assert spec.fingerprint() == equivalent.fingerprint()
    assert (spec.grace_us, spec.stuck_after_us) == (15 * 60_000_000, 3 * 3_600_000_000)


def test_the_stored_command_has_the_stores_password_masked() -> None:
    url = "postgresql://app:s3cret-pw@db/app"
    options = _options("--schedule", "* * * * *", command=("psql", url, "-c", "select 1"))
    spec = _spec_of(options, CronSchedule("* * * * *"), url)
    stored = json.dumps(spec.definition())
    assert "s3cret-pw" not in stored
    assert options.command[1] == url  # what runs is unchanged


@pytest.mark.parametrize("option", ["--grace", "--stuck-after"])
def test_grace_and_stuck_after_need_a_schedule_and_a_positive_duration(option: str) -> None:
    from fleetcron.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=f"^{option} needs --schedule"):
        _options(option, "5m")
    for bad, problem in (("0s", "must be positive"), ("-5m", "must be positive"), ("x", "")):
        with pytest.raises(ConfigurationError, match=f"{option}.*{problem}"):
            _options("--schedule", "* * * * *", f"{option}={bad}")


class _RacingStore:
    """A memory store on which another definition of the job is registered right after
    each ``job_register`` this client sends — before its claim."""

    def __init__(self, inner: MemoryStore, other: tuple[str, str, str]) -> None:
        self.inner = inner
        self.url = inner.url
        self.capabilities = inner.capabilities
        self.ops = _RacingOps(self)
        self.other = other
        self._race = False

    def run(self, operation: Operation[Any]) -> Any:
        result = self.inner.run(operation)
        if self._race:
            self._race = False
            self.inner.run(self.inner.ops.job_register(NS, [self.other]))
        return result

    def migrate(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class _RacingOps:
    def __init__(self, store: _RacingStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store.inner.ops, name)

    def job_register(self, namespace: str, jobs: Any) -> Operation[Any]:
        self._store._race = True
        return self._store.inner.ops.job_register(namespace, jobs)


def test_a_definition_registered_between_register_and_claim_skips_the_slot_loudly(
    tmp_path: Path, records: list[logging.LogRecord]
) -> None:
    clock = FakeClock(wall_us=START_US)
    inner = MemoryStore(clock=clock)
    store = _RacingStore(inner, ("report", '{"other": true}', "f" * 32))
    ran = tmp_path / "ran"
    options = _options(
        "--schedule",
        "* * * * *",
        "--no-keepalive",
        "--skipped-exit-code",
        "3",
        command=("sh", "-c", f"echo ran > {ran}"),
    )

    status = run_exec_schedule(
        store,
        NS,
        options,
        CronSchedule("* * * * *"),
        None,
        clock=clock,
    )

    assert status == 3
    assert not ran.exists()
    assert inner.run(inner.ops.run_list(NS, "report", 10)) == []  # the claim wrote nothing
    (warning,) = [r for r in records if getattr(r, "action", "") == "job_definition_conflict"]
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert "skipped: another definition of the job (ffffffffffff)" in message
    assert "give each its own name" in message


def test_an_exec_job_whose_invocations_are_all_skipped_is_not_reported_abandoned() -> None:
    clock = FakeClock(wall_us=START_US)
    store = MemoryStore(clock=clock)
    schedule = CronSchedule("* * * * *")
    # A run of an earlier slot holds the job for days (a long job, renewed meanwhile):
    # every invocation finds the job busy and skips, claiming nothing.
    (held,) = store.run(
        store.ops.run_claim(
            NS,
            [SlotClaim(job="report", slot_us=START_US - 20_000_000, run_id=str(uuid.uuid4()))],
            new_holder(),
            30 * DAY_US,
        )
    )
    assert held.status == "claimed"
    clock.advance(8 * 86_400)
    options = _options("--schedule", "* * * * *", "--no-keepalive", "--skipped-exit-code", "3")

    assert run_exec_schedule(store, NS, options, schedule, None, clock=clock) == 3

    with Fleet(store, namespace=NS) as fleet:
        idle = fleet.prune_jobs("7d", dry_run=True)
        row = fleet.store.run(store.ops.job_get(NS, "report"))
    assert idle == []  # the invocation's registration is a sign of life
    assert row is not None
    assert row.updated_us == START_US + 8 * DAY_US
    assert json.loads(row.definition)["schedule"] == schedule.definition()


def test_a_nul_in_the_commands_arguments_is_refused_before_anything_runs() -> None:
    # A shell cannot put one in argv; main() called from Python can.
    with pytest.raises(ConfigurationError) as caught:
        _options(command=("touch", "out\x00put"))
    assert caught.value.message == (
        "exec: command[1] holds a NUL character at position 3, which no program can be "
        "given: 'out\\x00put'"
    )
