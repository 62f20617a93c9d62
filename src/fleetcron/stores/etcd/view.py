"""The etcd store's tables as the in-memory store's steps see them, loaded on demand.

The etcd backend runs the in-memory store's operations — the reference implementation of
the contract — as optimistic transactions (etcd's own STM pattern). A :class:`View` is
one operation's picture of the keys it touched: a step is run against it; every key the
step asks for that is not loaded yet is noted and answered as absent, and the step is run
again once they are read, until a run asks for nothing new. The writes of that run are
then committed in one etcd txn whose compares say that nothing the step read changed
since (each key read: its ``mod_revision``; each prefix listed: no key in it newer than
the read). A txn whose compares fail is run again from fresh reads.

Leases are the exception to "a row is a key": a lease that is held lives in two keys, its
*live* key bound to an etcd lease (so etcd, not any clock, decides when it ends: the key
exists until etcd expires it) and its *last* key (the record as last written, kept after
the live key is gone, so a fence never goes back and ``lease list`` shows free names). A
lease whose live key exists is held, whatever the clock says; its nominal expiry is
shown, or "now + 1 µs" once the clock passed it while etcd still holds it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.parse
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from fleetcron.models import JobRecord, LeaseRecord, ReplicaRecord, RunRecord
from fleetcron.queue_models import CheckpointRecord, QueueItem
from fleetcron.stores.etcd.messages import (
    Compare,
    DeleteRange,
    Put,
    Range,
    RangeResponse,
    RequestOp,
    prefix_end,
)

__all__ = ["View", "Write"]

R = TypeVar("R")

LEASE_TABLE: Final = "leases"

_ABSENT: Final = object()
_DELETED: Final = object()


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _record_value(record: Any) -> bytes:
    fields = dataclasses.asdict(record)
    fields.pop("now_us", None)
    return json.dumps(fields, separators=(",", ":")).encode()


def _decode(kind: type[R], value: bytes, now: int) -> R:
    fields = json.loads(value)
    if "now_us" in {f.name for f in dataclasses.fields(kind)}:  # type: ignore[arg-type]
        fields["now_us"] = now
    return kind(**fields)


@dataclass(frozen=True, slots=True)
class _Table:
    """One table of the in-memory store's state: the record type of its rows, and how a
    row's key (a tuple whose first element is the namespace) becomes an etcd key."""

    name: str
    kind: type[Any]
    numbered: bool = False  # the key's last part is an integer (a slot, an item's id)

    def key(self, prefix: str, row: tuple[Any, ...]) -> str:
        namespace, *rest = row
        return f"{prefix}/{self.name}/{_q(namespace)}/" + "/".join(_q(str(p)) for p in rest)

    def scope(self, prefix: str, namespace: str | None, *more: str) -> str:
        if namespace is None:
            return f"{prefix}/{self.name}/"
        tail = "".join(f"{_q(p)}/" for p in more)
        return f"{prefix}/{self.name}/{_q(namespace)}/{tail}"

    def row(self, prefix: str, key: bytes) -> tuple[Any, ...]:
        parts = key.decode()[len(prefix) + len(self.name) + 2 :].split("/")
        decoded: list[Any] = [urllib.parse.unquote(p) for p in parts]
        if self.numbered:
            decoded[-1] = int(decoded[-1])
        return tuple(decoded)


_TABLES: Final = {
    table.name: table
    for table in (
        _Table(LEASE_TABLE, LeaseRecord),
        _Table("runs", RunRecord, numbered=True),
        _Table("jobs", JobRecord),
        _Table("replicas", ReplicaRecord),
        _Table("items", QueueItem, numbered=True),
        _Table("checkpoints", CheckpointRecord),
    )
}
_LIVE: Final = "live"  # the held leases' keys, bound to etcd leases
_HELD_UNTIL: Final = "held_until_us"


def _live(last_key: str) -> str:
    """The live key of the lease whose last key is ``last_key``."""
    return last_key.replace(f"/{LEASE_TABLE}/", f"/{_LIVE}/", 1)


@dataclass(frozen=True, slots=True)
class Write:
    """One key to change: ``value`` ``None`` deletes it; ``ttl_s`` > 0 binds it to an
    etcd lease of that many seconds (granted before the txn)."""

    key: str
    value: bytes | None
    ttl_s: int = 0


@dataclass(slots=True)
class _Loaded:
    value: bytes | None
    mod_revision: int


@dataclass(slots=True)
class View:
    """What one operation has read of the store, and the pass now running over it."""

    prefix: str
    namespace: str | None
    keys: dict[str, _Loaded] = field(default_factory=dict)
    scans: dict[str, int] = field(default_factory=dict)  # prefix -> revision read at
    wanted_keys: set[str] = field(default_factory=set)
    wanted_scans: set[str] = field(default_factory=set)
    now: int = 0
    _writes: dict[tuple[str, tuple[Any, ...]], Any] = field(default_factory=dict)
    _last_id: int | None = None

    # -- reading

    def missing(self) -> bool:
        return bool(self.wanted_keys or self.wanted_scans)

    def reads(self) -> list[Range]:
        """The ranges to read next: every key and prefix a pass asked for."""
        ranges = [Range(p, prefix_end(p)) for p in sorted(self.wanted_scans)]
        ranges += [Range(k) for k in sorted(self.wanted_keys)]
        return ranges

    def load(self, ranges: list[Range], replies: list[RangeResponse]) -> None:
        for asked, reply in zip(ranges, replies, strict=True):
            key = asked.key if isinstance(asked.key, str) else asked.key.decode()
            if asked.range_end is None:
                kv = reply.kvs[0] if reply.kvs else None
                self.keys[key] = _Loaded(kv.value if kv else None, kv.mod_revision if kv else 0)
            else:
                self.scans[key] = reply.revision
                for kv in reply.kvs:
                    self.keys[kv.key.decode()] = _Loaded(kv.value, kv.mod_revision)
        self.wanted_keys.clear()
        self.wanted_scans.clear()

    def forget(self) -> None:
        """Drop everything read (a txn's compares failed: read again)."""
        self.keys.clear()
        self.scans.clear()

    def _covered(self, key: str) -> bool:
        return any(key.startswith(p) for p in self.scans)

    def _value(self, key: str) -> bytes | None:
        loaded = self.keys.get(key)
        if loaded is not None:
            return loaded.value
        if not self._covered(key):
            self.wanted_keys.add(key)
        return None

    def _scanned(self, scope: str) -> bool:
        if any(scope.startswith(p) for p in self.scans):
            return True
        self.wanted_scans.add(scope)
        return False

    # -- one pass

    def state(self, now: int) -> _State:
        """A fresh picture for one run of a step at ``now`` (writes of an earlier pass
        are dropped)."""
        self.now = now
        self._writes = {}
        self._last_id = None
        return _State(self)

    def lookup(self, table: str, row: tuple[Any, ...]) -> Any:
        written = self._writes.get((table, row), _ABSENT)
        if written is not _ABSENT:
            return None if written is _DELETED else written
        spec = _TABLES[table]
        if table == LEASE_TABLE:
            return self._lease(row)
        value = self._value(spec.key(self.prefix, row))
        return None if value is None else _decode(spec.kind, value, self.now)

    def _lease(self, row: tuple[Any, ...]) -> LeaseRecord | None:
        last_key = _TABLES[LEASE_TABLE].key(self.prefix, row)
        live = self._value(_live(last_key))
        last = self._value(last_key)
        if live is not None:
            fields = json.loads(live)
            held_until = fields.pop(_HELD_UNTIL)
            record = LeaseRecord(**fields, now_us=self.now)
            if record.expires_us <= self.now:  # etcd holds it still: say until when
                record = dataclasses.replace(record, expires_us=max(held_until, self.now + 1))
            return record
        if last is None:
            return None
        record = _decode(LeaseRecord, last, self.now)
        if record.expires_us > self.now:  # etcd let it go before this clock's reading
            record = dataclasses.replace(record, expires_us=self.now)
        return record

    def rows(self, table: str, *more: str) -> list[tuple[tuple[Any, ...], Any]]:
        """Every row of ``table`` in the view's namespace (or under ``more``), written
        ones included; asks for the prefix when it is not loaded."""
        spec = _TABLES[table]
        scope = spec.scope(self.prefix, self.namespace, *more)
        found: dict[tuple[Any, ...], Any] = {}
        scanned = self._scanned(scope)
        if table == LEASE_TABLE:  # a held lease's live key too, in the same read
            scanned = self._scanned(scope.replace(f"/{LEASE_TABLE}/", f"/{_LIVE}/", 1)) and scanned
        if scanned:
            for key in list(self.keys):
                if key.startswith(scope) and self.keys[key].value is not None:
                    row = spec.row(self.prefix, key.encode())
                    if table == LEASE_TABLE:
                        found[row] = self._lease(row)
                    else:
                        value = self.keys[key].value
                        assert value is not None
                        found[row] = _decode(spec.kind, value, self.now)
        for (name, row), value in self._writes.items():
            if name == table and spec.key(self.prefix, row).startswith(scope):
                if value is _DELETED:
                    found.pop(row, None)
                else:
                    found[row] = value
        return sorted(found.items(), key=lambda item: item[0])

    def write(self, table: str, row: tuple[Any, ...], value: Any) -> None:
        self._writes[(table, row)] = value

    def delete(self, table: str, row: tuple[Any, ...]) -> None:
        self._writes[(table, row)] = _DELETED

    @property
    def last_id(self) -> int:
        if self._last_id is not None:
            return self._last_id
        value = self._value(f"{self.prefix}/item-id")
        return 0 if value is None else int(value)

    @last_id.setter
    def last_id(self, value: int) -> None:
        self._last_id = value

    # -- the commit

    def changes(self) -> list[Write]:
        """What the last pass changed, as keys to write (unchanged rows left out)."""
        writes: list[Write] = []
        for (table, row), value in self._writes.items():
            spec = _TABLES[table]
            key = spec.key(self.prefix, row)
            if table == LEASE_TABLE:
                writes += self._lease_writes(key, value)
                continue
            if value is _DELETED:
                if self.keys.get(key, _Loaded(None, 0)).value is not None:
                    writes.append(Write(key, None))
                continue
            encoded = _record_value(value)
            if self.keys.get(key, _Loaded(None, 0)).value != encoded:
                writes.append(Write(key, encoded))
        if self._last_id is not None:
            writes.append(Write(f"{self.prefix}/item-id", str(self._last_id).encode()))
        return writes

    def _lease_writes(self, key: str, value: Any) -> list[Write]:
        live = _live(key)
        if value is _DELETED:
            return [Write(live, None), Write(key, None)]
        record: LeaseRecord = value
        encoded = _record_value(record)
        if record.expires_us > self.now:
            ttl_s = max(1, math.ceil((record.expires_us - self.now) / 1_000_000))
            fields = json.loads(encoded)
            # etcd ends the key no earlier than this (its TTL counts from the grant, after
            # this clock's now): what a reader is told once the nominal expiry passed.
            fields[_HELD_UNTIL] = self.now + ttl_s * 1_000_000
            held = json.dumps(fields, separators=(",", ":")).encode()
            return [Write(live, held, ttl_s), Write(key, encoded)]
        writes = [Write(key, encoded)]
        if self.keys.get(live, _Loaded(None, 0)).value is not None:
            writes.insert(0, Write(live, None))
        return writes

    def compares(self, writes: list[Write]) -> list[Compare]:
        """That nothing read changed: each key read alone unchanged, each prefix read
        holding no key changed after its read, each written key unchanged."""
        compares = [
            Compare(p, "mod_revision", "<", revision + 1, range_end=prefix_end(p))
            for p, revision in sorted(self.scans.items())
        ]
        written = {w.key for w in writes}
        for key, loaded in sorted(self.keys.items()):
            if key in written or not self._covered(key):
                compares.append(Compare.mod_revision(key, "==", loaded.mod_revision))
        return compares

    def ops(self, writes: list[Write], leases: dict[int, int]) -> list[RequestOp]:
        """The txn's operations; ``leases`` maps a TTL to the etcd lease granted for it."""
        ops: list[RequestOp] = []
        for w in writes:
            if w.value is None:
                ops.append(DeleteRange(w.key))
            else:
                ops.append(Put(w.key, w.value, leases.get(w.ttl_s, 0) if w.ttl_s else 0))
        return ops


class _Rows(MutableMapping[tuple[Any, ...], Any]):
    """One table of the state, as the memory store's steps use it (a dict by row key)."""

    def __init__(self, view: View, table: str, *more: str) -> None:
        self._view, self._table, self._more = view, table, more

    def __getitem__(self, row: tuple[Any, ...]) -> Any:
        found = self._view.lookup(self._table, row)
        if found is None:
            raise KeyError(row)
        return found

    def __setitem__(self, row: tuple[Any, ...], value: Any) -> None:
        self._view.write(self._table, row, value)

    def __delitem__(self, row: tuple[Any, ...]) -> None:
        if self._view.lookup(self._table, row) is None:
            raise KeyError(row)
        self._view.delete(self._table, row)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter([row for row, _ in self._view.rows(self._table, *self._more)])

    def __len__(self) -> int:
        return len(self._view.rows(self._table, *self._more))

    def items(self) -> Any:
        return self._view.rows(self._table, *self._more)


class _QueueRows(MutableMapping[int, QueueItem]):
    """One queue's items by id."""

    def __init__(self, view: View, namespace: str, queue: str) -> None:
        self._view, self._namespace, self._queue = view, namespace, queue

    def _row(self, item_id: int) -> tuple[str, str, int]:
        return (self._namespace, self._queue, item_id)

    def __getitem__(self, item_id: int) -> QueueItem:
        found = self._view.lookup("items", self._row(item_id))
        if found is None:
            raise KeyError(item_id)
        return found  # type: ignore[no-any-return]

    def __setitem__(self, item_id: int, value: QueueItem) -> None:
        self._view.write("items", self._row(item_id), value)

    def __delitem__(self, item_id: int) -> None:
        if self._view.lookup("items", self._row(item_id)) is None:
            raise KeyError(item_id)
        self._view.delete("items", self._row(item_id))

    def _all(self) -> list[tuple[int, QueueItem]]:
        rows = self._view.rows("items", self._queue)
        return [(row[2], item) for row, item in rows]

    def __iter__(self) -> Iterator[int]:
        return iter([item_id for item_id, _ in self._all()])

    def __len__(self) -> int:
        return len(self._all())

    def items(self) -> Any:
        return self._all()

    def values(self) -> Any:
        return [item for _, item in self._all()]


class _Queues(MutableMapping[tuple[str, str], _QueueRows]):
    """Every queue of the namespace: ``(namespace, queue)`` to its items."""

    def __init__(self, view: View) -> None:
        self._view = view

    def __getitem__(self, key: tuple[str, str]) -> _QueueRows:
        return _QueueRows(self._view, key[0], key[1])

    def __setitem__(self, key: tuple[str, str], value: Any) -> None:
        for item_id, item in dict(value).items():
            self._view.write("items", (key[0], key[1], item_id), item)

    def __delitem__(self, key: tuple[str, str]) -> None:
        for item_id in list(self[key]):
            self._view.delete("items", (key[0], key[1], item_id))

    def _names(self) -> list[tuple[str, str]]:
        return sorted({(row[0], row[1]) for row, _ in self._view.rows("items")})

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def get(self, key: tuple[str, str], default: Any = None) -> Any:
        rows = self[key]
        return rows if len(rows) else default

    def setdefault(self, key: tuple[str, str], default: Any = None) -> Any:
        return self[key]


class _QueueTables:
    """:class:`~fleetcron.stores.memory_queue.QueueTables` over the view."""

    def __init__(self, view: View) -> None:
        self._view = view
        self.items = _Queues(view)
        self.checkpoints = _Rows(view, "checkpoints")

    @property
    def last_id(self) -> int:
        return self._view.last_id

    @last_id.setter
    def last_id(self, value: int) -> None:
        self._view.last_id = value


class _State:
    """:class:`~fleetcron.stores.memory_state.State` over the view."""

    def __init__(self, view: View) -> None:
        self.leases = _Rows(view, LEASE_TABLE)
        self.runs = _Rows(view, "runs")
        self.jobs = _Rows(view, "jobs")
        self.replicas = _Rows(view, "replicas")
        self.queues = _QueueTables(view)
