"""Helpers shared by the contract tests: reading the store's clock and waiting on it, and
starting contender processes together."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from fleetcron.models import LeaseRecord
from fleetcron.stores import SyncStore

T = TypeVar("T")

TTL_LONG_US = 30_000_000  # longer than any test: never expires by itself


def acquire(
    store: SyncStore,
    namespace: str,
    name: str,
    holder: str,
    *,
    ttl_us: int = TTL_LONG_US,
    least_us: int = 0,
) -> LeaseRecord | None:
    return store.run(store.ops.lease_acquire(namespace, name, holder, ttl_us, least_us))


def must_acquire(
    store: SyncStore,
    namespace: str,
    name: str,
    holder: str,
    *,
    ttl_us: int = TTL_LONG_US,
    least_us: int = 0,
) -> LeaseRecord:
    record = acquire(store, namespace, name, holder, ttl_us=ttl_us, least_us=least_us)
    assert record is not None, f"{name!r} should have been free"
    return record


def release(store: SyncStore, record: LeaseRecord) -> bool:
    return store.run(
        store.ops.lease_release(record.namespace, record.name, record.holder, record.fence)
    )


def row(store: SyncStore, namespace: str, name: str) -> LeaseRecord:
    record = store.run(store.ops.lease_get(namespace, name))
    assert record is not None, f"no lease row for {name!r}"
    return record


def stored(record: LeaseRecord) -> LeaseRecord:
    """The persistent part of a record (``now_us`` is only when it was read)."""
    return dataclasses.replace(record, now_us=0)


def expiry_slack_us(store: SyncStore) -> int:
    """How long after a lease's nominal expiry the store may still hold it: none, except
    on etcd, whose leases end when its leader counts their TTL out (whole seconds from the
    grant, checked every 500 ms) — later than the nominal expiry, never earlier."""
    return 2_500_000 if store.url.startswith(("etcd://", "etcds://")) else 0


def wait_until_freed(
    store: SyncStore, namespace: str, name: str, expires_us: int, *, timeout: float = 10.0
) -> LeaseRecord:
    """Sleep until the store's clock is past ``expires_us`` by the store's
    :func:`expiry_slack_us`: a lease that ended then is free."""
    target = expires_us + expiry_slack_us(store)
    return wait_for_store_time(store, namespace, name, target, timeout=timeout)


def wait_for_store_time(
    store: SyncStore, namespace: str, name: str, target_us: int, *, timeout: float = 10.0
) -> LeaseRecord:
    """Sleep until the *store's* clock (read through the row of ``name``) reaches ``target_us``.

    Returns the first row read at or after ``target_us``.
    """
    give_up = time.monotonic() + timeout
    while True:
        record = row(store, namespace, name)
        if record.now_us >= target_us:
            return record
        assert time.monotonic() < give_up, "the store clock did not reach the target"
        time.sleep(min(max((target_us - record.now_us) / 1e6, 0.001), 0.05))


def eventually(probe: Callable[[], T | None], *, timeout: float = 10.0, every: float = 0.01) -> T:
    """Poll ``probe`` until it returns something other than ``None``/falsy."""
    give_up = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(every)


def run_together(commands: Sequence[list[str]], role: str, *, timeout_s: float = 60.0) -> list[Any]:
    """Start one process per command, wait until every one has said ``ready`` (connected),
    tell them all ``go``, and return each one's JSON answer from its stdout, in order. A
    process that fails to start, fails or outlives ``timeout_s`` fails the test; none is
    left running."""
    with started_together(commands, role, timeout_s=timeout_s) as finish:
        return finish()


@contextlib.contextmanager
def started_together(
    commands: Sequence[list[str]], role: str, *, timeout_s: float = 60.0
) -> Iterator[Callable[[], list[Any]]]:
    """:func:`run_together` for processes that run until told to stop: inside the block
    they have all been told ``go``; the function it gives tells each ``stop`` and returns
    each one's JSON answer, in order. None is left running."""
    workers = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for command in commands
    ]

    def finish() -> list[Any]:
        results = []
        for worker in workers:
            out, _ = worker.communicate("stop\n", timeout=timeout_s)
            assert worker.returncode == 0, f"a {role} failed (exit {worker.returncode})"
            results.append(json.loads(out))
        return results

    try:
        for worker in workers:  # every one connected before any starts
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready", f"a {role} did not start"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        yield finish
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
