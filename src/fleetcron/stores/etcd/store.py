"""The etcd store, sync and async: every operation of the contract as an optimistic etcd
transaction over the rows it touches (:mod:`fleetcron.stores.etcd.view`).

**Operations.** The in-memory store's operations are the reference implementation of the
contract; this backend runs each of their steps against a :class:`View` of the keys the
step reads, then commits what the step wrote in one txn compared on everything it read —
etcd's STM pattern. A txn that lost a race is run again from fresh reads.

**Time.** A held lease's live key is bound to an etcd lease: etcd alone decides when it
ends (whole seconds, rounded up; refreshed when the cluster elects a new leader), so a
lease is freed no earlier than its nominal expiry, never early. What the rows record as
times (``acquired_us``, a run's start, a queue item's visibility) is the *store clock*:
the low bound of the pinned member's clock as the ``Date`` headers of its answers bound it
(:mod:`fleetcron.stores.etcd.clock`) — never ahead of the member, so a slot is never
claimed before its time there. A background probe narrows the bounds to a few
milliseconds within seconds of opening.

**Fences.** ``max(previous fence + 1, store clock)``, the previous fence kept by the
lease's *last* key (which outlives the live key): strictly increasing per name, and above
every fence a clock-folded backend gave before the namespace moved here.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from fleetcron.errors import ConfigurationError, StoreError, StoreUnavailable
from fleetcron.jobspec import Retention
from fleetcron.models import ClaimResult, JobRecord, RunFinish, RunNote, SlotClaim
from fleetcron.queue_models import QueuePut
from fleetcron.stores.base import (
    Capability,
    Operation,
    Statement,
    connect_error,
    drive,
    drive_async,
)
from fleetcron.stores.etcd.async_client import AsyncEtcdClient
from fleetcron.stores.etcd.client import EtcdClient
from fleetcron.stores.etcd.doctor import EtcdFacts, warn_at_open
from fleetcron.stores.etcd.errors import EtcdCompacted, EtcdError, EtcdTooManyOps
from fleetcron.stores.etcd.messages import (
    Endpoint,
    Range,
    RangeResponse,
    Txn,
    TxnResponse,
    parse_endpoints,
    prefix_end,
)
from fleetcron.stores.etcd.pinned import Pinned
from fleetcron.stores.etcd.view import View
from fleetcron.stores.memory import MemoryOperations
from fleetcron.stores.memory_step import Step
from fleetcron.stores.url import StoreURL

__all__ = [
    "AsyncEtcdStore",
    "EtcdOperations",
    "EtcdStore",
    "Scoped",
    "open_async",
    "open_sync",
]

T = TypeVar("T")

MAX_TXN_OPS: Final = 128
"""etcd's default ``--max-txn-ops``: the compares, and the operations, of one txn."""

_READS_PER_TXN: Final = 100
_TRIES: Final = 64  # txns lost to concurrent writers before an operation gives up
_CLOCK_WIDTH_S: Final = 0.02  # the probe stops narrowing the clock's bounds below this
_CLOCK_RECHECK_S: Final = 10.0
DEFAULT_PREFIX: Final = "fleetcron"


@dataclass(frozen=True, slots=True)
class Scoped(Statement):
    """A step of the in-memory store's operations, run on the rows of ``namespace``
    (``None``: of every namespace)."""

    namespace: str | None
    fn: Callable[[Any, int], Any]


def _in_namespace(operation: Operation[T], namespace: str | None) -> Operation[T]:
    """``operation`` with each of its steps scoped to ``namespace``."""
    try:
        statement = next(operation)
        while True:
            if isinstance(statement, Step):
                statement = Scoped(namespace, statement.fn)
            # (an operation made of another one yields that one's statements, scoped)
            statement = operation.send((yield statement))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        operation.close()


def _scoped(method: Callable[..., Operation[T]]) -> Callable[..., Operation[T]]:
    @functools.wraps(method)
    def scoped(self: EtcdOperations, namespace: str, *args: Any, **kwargs: Any) -> Operation[T]:
        operation = _in_namespace(method(self, namespace, *args, **kwargs), namespace)
        operation.__name__ = method.__name__  # type: ignore[attr-defined]  # (for its readers)
        return operation

    return scoped


_ROWS_PER_TXN: Final = 25
"""Claims, finishes, notes or items one txn takes: each touches up to four keys (the run,
the job, a lease's live and last keys), and a txn compares and writes at most 128."""


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[start : start + _ROWS_PER_TXN] for start in range(0, len(items), _ROWS_PER_TXN)]


class EtcdOperations(MemoryOperations):
    """Every operation of the contract on etcd: the in-memory store's, each step scoped to
    its namespace's keys (see the module's docstring). A batch (claims, finishes, notes,
    queue items, job definitions) is committed 25 rows per txn, each row's change atomic
    on its own as the contract asks; a backfill is one txn, so at most what one txn
    writes."""

    def store_now(self) -> Operation[int]:
        return _in_namespace(super().store_now(), "")

    def job_namespaces(self) -> Operation[list[str]]:
        return _in_namespace(super().job_namespaces(), None)

    def run_claim(
        self, namespace: str, claims: Sequence[SlotClaim], holder: str, ttl_us: int
    ) -> Operation[list[ClaimResult]]:
        answers: list[ClaimResult] = []
        for chunk in _chunks(claims):
            answers += yield from _in_namespace(
                super().run_claim(namespace, chunk, holder, ttl_us), namespace
            )
        return answers

    def run_finish_many(
        self, namespace: str, finishes: Sequence[RunFinish]
    ) -> Operation[list[bool]]:
        answers: list[bool] = []
        for chunk in _chunks(finishes):
            answers += yield from _in_namespace(
                super().run_finish_many(namespace, chunk), namespace
            )
        return answers

    def run_record_many(self, namespace: str, notes: Sequence[RunNote]) -> Operation[list[bool]]:
        answers: list[bool] = []
        for chunk in _chunks(notes):
            answers += yield from _in_namespace(
                super().run_record_many(namespace, chunk), namespace
            )
        return answers

    def job_register(
        self, namespace: str, jobs: Sequence[tuple[str, str, str]]
    ) -> Operation[list[JobRecord | None]]:
        answers: list[JobRecord | None] = []
        for chunk in _chunks(jobs):
            answers += yield from _in_namespace(super().job_register(namespace, chunk), namespace)
        return answers

    def queue_put(
        self, namespace: str, queue: str, items: Sequence[QueuePut]
    ) -> Operation[list[int | None]]:
        answers: list[int | None] = []
        for chunk in _chunks(items):
            answers += yield from _in_namespace(
                super().queue_put(namespace, queue, chunk), namespace
            )
        return answers


for _name in (
    name
    for name in dir(MemoryOperations)
    if not name.startswith("_") and name not in EtcdOperations.__dict__
):
    setattr(EtcdOperations, _name, _scoped(getattr(MemoryOperations, _name)))


# -- one transaction, free of I/O: the drivers below answer its requests


class _Now(Statement):
    """Ask for the store clock's now (µs)."""


_NOW: Final = _Now()


@dataclass(frozen=True, slots=True)
class _Read(Statement):
    ranges: list[Range]


@dataclass(frozen=True, slots=True)
class _Grant(Statement):
    ttl_s: int


@dataclass(frozen=True, slots=True)
class _Commit(Statement):
    txn: Txn


def transact(prefix: str, scoped: Scoped) -> Operation[Any]:
    """Run ``scoped``'s step against the store until one run of it reads nothing new,
    then commit its writes compared on its reads; again from fresh reads when the
    compares fail."""
    view = View(prefix, scoped.namespace)
    for _ in range(_TRIES):
        while True:
            now: int = yield _NOW
            state = view.state(now)
            try:
                result = scoped.fn(state, now)
            except Exception:
                if not view.missing():
                    raise
            if not view.missing():
                break
            ranges = view.reads()
            replies: list[RangeResponse] = []
            for start in range(0, len(ranges), _READS_PER_TXN):
                replies += yield _Read(ranges[start : start + _READS_PER_TXN])
            view.load(ranges, replies)
        writes = view.changes()
        if not writes:
            return result
        compares = view.compares(writes)
        if len(compares) > MAX_TXN_OPS or len(writes) > MAX_TXN_OPS:
            raise StoreError(
                f"one etcd operation would read {len(compares)} and write {len(writes)} "
                f"keys in one txn; etcd allows {MAX_TXN_OPS} of each (--max-txn-ops)"
            )
        leases: dict[int, int] = {}
        for ttl_s in sorted({w.ttl_s for w in writes if w.ttl_s}):
            leases[ttl_s] = yield _Grant(ttl_s)
        if (yield _Commit(Txn(compares, view.ops(writes, leases)))):
            return result
        view.forget()
    raise StoreUnavailable(
        f"etcd: {_TRIES} transactions in a row lost a race with other writers; try again"
    )


class _StoreClock:
    """The store clock (µs) from a client's bounds of its pinned member: this host's clock
    when it lies within them, else their low bound; never going back within this store.

    The bounds are up to a second wide in a client's first seconds (``Date`` headers count
    seconds), so two clients' low bounds may differ by that much: their times would not
    compare. Hosts that NTP keeps within milliseconds of the member read the same instant
    within milliseconds, and a host's clock inside the bounds is no further from the
    member than they are wide. A host clock outside them (off, or stepped) is not used:
    the low bound is never ahead of the member, so no slot comes early there."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._last = 0

    def now(self, client: Pinned) -> int | None:
        bounds = client.clock()
        if bounds is None:
            return None
        host = self._wall()
        member = host if bounds.low <= host < bounds.high else bounds.low
        self._last = max(self._last, int(member * 1_000_000))
        return self._last


def _dated(now: int | None, client: Pinned) -> int:
    """``now``, or the error of a member whose answers carry no ``Date`` header (its
    clock, the store's, cannot be known: a proxy in front of it may strip the header)."""
    if now is None:
        raise StoreError(
            f"etcd at {client.endpoint} answers without a Date header: the store's clock "
            "cannot be read (is a proxy in front of it removing the header?)"
        )
    return now


def _translate(exc: EtcdError) -> StoreError:
    if isinstance(exc, EtcdTooManyOps):
        return StoreError(
            f"etcd refused a txn as too large: {exc.message} (raise --max-txn-ops, or "
            "use fewer items per call)"
        )
    return exc


def _client_args(url: StoreURL) -> tuple[tuple[Endpoint, ...], str]:
    """The members and the key prefix of an ``etcd://`` URL; anything it cannot honour
    (a parameter besides the timeouts, credentials) is refused, naming it."""
    if url.query:
        names = ", ".join(sorted(url.query))
        raise ConfigurationError(
            f"backend URL {url.redacted!r}: etcd takes no parameter {names!r} (only "
            "timeout and connect_timeout)"
        )
    rest = url.driver_url.split("://", 1)[1].split("?", 1)[0]
    hosts, _, path = rest.partition("/")
    if "@" in hosts:
        raise ConfigurationError(
            f"backend URL {url.redacted!r}: etcd authentication (user and password) is not "
            "supported yet; give members that serve clients without it"
        )
    try:
        endpoints = parse_endpoints(hosts, tls=url.raw.lower().startswith("etcds"))
    except ValueError as exc:
        raise ConfigurationError(f"backend URL {url.redacted!r}: {exc}") from None
    return endpoints, path.strip("/") or DEFAULT_PREFIX


ETCD_RETENTION: Final = Retention(older_than_us=86_400_000_000, keep=10)
"""The retention of a job that sets none, on etcd: a day, and its newest 10 runs (etcd
keeps every key in memory; other backends keep 30 days and 100)."""


class EtcdStore:
    """Sync etcd store."""

    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK | Capability.PERSISTENT
    default_retention = ETCD_RETENTION

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = EtcdOperations()
        endpoints, self.prefix = _client_args(url)
        self._client = EtcdClient(
            endpoints, timeout=url.timeout_s, connect_timeout=url.connect_timeout_s
        )
        self._lock = threading.Lock()
        self._clock = _StoreClock()
        self._closed = threading.Event()
        try:
            warn_at_open(self.url, self._client.status())
        except EtcdError as exc:
            self._client.close()
            raise connect_error(self.url, exc) from exc
        self._prober = threading.Thread(
            target=self._narrow, name="fleetcron-etcd-clock", daemon=True
        )
        self._prober.start()

    def _narrow(self) -> None:
        """Ask the member at the instants that narrow its clock's bounds most, until they
        are a few milliseconds wide; look again now and then (they widen with age)."""
        while not self._closed.is_set():
            bounds = self._client.clock()
            tick = self._client.next_tick()
            if bounds is None or tick is None or bounds.width <= _CLOCK_WIDTH_S:
                self._closed.wait(_CLOCK_RECHECK_S)
                if bounds is not None and bounds.width <= _CLOCK_WIDTH_S:
                    continue
            else:
                self._closed.wait(max(0.0, tick - time.monotonic()))
            if self._closed.is_set():
                return
            try:
                self._client.range(f"{self.prefix}/clock")
            except EtcdError:
                self._closed.wait(1.0)

    def _now(self) -> int:
        now = self._clock.now(self._client)
        if now is None:
            self._client.range(f"{self.prefix}/clock")
            now = self._clock.now(self._client)
        return _dated(now, self._client)

    def _answer(self, request: Statement) -> Any:
        match request:
            case _Now():
                return self._now()
            case _Read(ranges):
                reply = self._client.txn(success=ranges)
                return [reply.response(i, RangeResponse) for i in range(len(ranges))]
            case _Grant(ttl_s):
                return self._client.grant(ttl_s).id
            case _Commit(txn):
                result: TxnResponse = self._client.txn(txn.compare, txn.success)
                return result.succeeded
        raise TypeError(f"not an etcd request: {request!r}")

    def _execute(self, statement: Statement) -> Any:
        if not isinstance(statement, Scoped):
            raise TypeError(f"the etcd store cannot run {statement!r}")
        try:
            return drive(transact(self.prefix, statement), self._answer)
        except EtcdError as exc:
            raise _translate(exc) from exc

    def run(self, operation: Operation[T]) -> T:
        with self._lock:
            return drive(operation, self._execute)

    def migrate(self) -> list[str]:
        """etcd keeps no schema; nothing to apply."""
        return []

    def doctor_facts(self) -> tuple[EtcdFacts]:
        """What ``fleetcron doctor`` judges of the cluster: members, alarms, database size
        and the store's keys (:mod:`fleetcron.stores.etcd.doctor`)."""
        try:
            with self._lock:
                sent = time.monotonic()
                status = self._client.status()
                round_trip = time.monotonic() - sent
                bounds = self._client.clock()
                host = time.time()
                endpoint = str(self._client.endpoint)
                members = self._client.member_list()
                alarms = self._client.alarm_list()
                top = f"{self.prefix}/".encode()
                keys = self._client.range(top, prefix_end(top), count_only=True).count
                try:  # history kept since revision 1: nothing was ever compacted
                    self._client.range(top, count_only=True, revision=1)
                    compacted = False
                except EtcdCompacted:
                    compacted = True
        except EtcdError as exc:
            raise _translate(exc) from exc
        return (
            EtcdFacts(
                endpoint=endpoint,
                version=status.version,
                members=tuple(m.name or f"{m.id:x}" for m in members),
                leader=status.leader,
                db_size=status.db_size,
                db_size_in_use=status.db_size_in_use,
                alarms=tuple(f"{a.alarm} (member {a.member_id:x})" for a in alarms),
                prefix=self.prefix,
                keys=keys,
                revision=status.header.revision,
                compacted=compacted,
                round_trip_s=round_trip,
                clock_low_s=None if bounds is None else bounds.low - host,
                clock_high_s=None if bounds is None else bounds.high - host,
            ),
        )

    def close(self) -> None:
        self._closed.set()
        self._client.close()


class AsyncEtcdStore:
    """Async etcd store."""

    capabilities = EtcdStore.capabilities
    default_retention = ETCD_RETENTION

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = EtcdOperations()
        endpoints, self.prefix = _client_args(url)
        self._client = AsyncEtcdClient(
            endpoints, timeout=url.timeout_s, connect_timeout=url.connect_timeout_s
        )
        self._clock = _StoreClock()
        self._prober: asyncio.Task[None] | None = None

    async def open(self) -> None:
        try:
            warn_at_open(self.url, await self._client.status())
        except EtcdError as exc:
            await self._client.close()
            raise connect_error(self.url, exc) from exc
        self._prober = asyncio.get_running_loop().create_task(self._narrow())

    async def _narrow(self) -> None:
        """Async twin of :meth:`EtcdStore._narrow`."""
        while True:
            bounds = self._client.clock()
            tick = self._client.next_tick()
            if bounds is None or tick is None or bounds.width <= _CLOCK_WIDTH_S:
                await asyncio.sleep(_CLOCK_RECHECK_S)
                if bounds is not None and bounds.width <= _CLOCK_WIDTH_S:
                    continue
            else:
                await asyncio.sleep(max(0.0, tick - time.monotonic()))
            try:
                await self._client.range(f"{self.prefix}/clock")
            except EtcdError:
                await asyncio.sleep(1.0)

    async def _now(self) -> int:
        now = self._clock.now(self._client)
        if now is None:
            await self._client.range(f"{self.prefix}/clock")
            now = self._clock.now(self._client)
        return _dated(now, self._client)

    async def _answer(self, request: Statement) -> Any:
        match request:
            case _Now():
                return await self._now()
            case _Read(ranges):
                reply = await self._client.txn(success=ranges)
                return [reply.response(i, RangeResponse) for i in range(len(ranges))]
            case _Grant(ttl_s):
                return (await self._client.grant(ttl_s)).id
            case _Commit(txn):
                result: TxnResponse = await self._client.txn(txn.compare, txn.success)
                return result.succeeded
        raise TypeError(f"not an etcd request: {request!r}")

    async def _execute(self, statement: Statement) -> Any:
        if not isinstance(statement, Scoped):
            raise TypeError(f"the etcd store cannot run {statement!r}")
        try:
            return await drive_async(transact(self.prefix, statement), self._answer)
        except EtcdError as exc:
            raise _translate(exc) from exc

    async def run(self, operation: Operation[T]) -> T:
        return await drive_async(operation, self._execute)

    async def migrate(self) -> list[str]:
        return []

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        await self._client.close()


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> EtcdStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`): etcd keeps no
    schema, and opening writes nothing."""
    return EtcdStore(url)


async def open_async(url: StoreURL, *, create: bool, migrate: bool) -> AsyncEtcdStore:
    """The backend's async entry point."""
    store = AsyncEtcdStore(url)
    await store.open()
    return store
