"""Lease names and namespaces full of SQL, Lua, Redis-key, glob and shell metacharacters,
Unicode that collations fold, and lengths at the limits, on every backend:

- each valid name round-trips exactly (NFC): acquire, get, list, release and prune give
  back the very name, in its namespace, with its holder and fence;
- contention (``LockBusy``) names the holder as ``host:pid``, never with its secret token;
- two distinct names never share a lease: a name and its upper/lower/case-folded,
  accent-stripped, NFKC, ``ß``/``ss``, ``%``/``_``, zero-width-space and hash-tag
  lookalikes, and the same ``namespace:name`` text split at another colon, are each a lease
  of their own — while two canonically equivalent spellings (NFD/NFC) are one;
- a name or namespace a store cannot hold faithfully — empty, too long (also in 4-byte
  characters), with a control character or a lone surrogate, or with whitespace around it
  (what a MySQL PAD SPACE collation would ignore) — is refused with a
  ``ConfigurationError`` naming the problem on one line, before anything is written.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.helpers import wait_for
from fleetcron import ConfigurationError, Fleet, Lease, LockBusy
from fleetcron.names import MAX_NAMESPACE_LENGTH
from fleetcron.stores import SyncStore
from security.fuzzing import (
    budget,
    fuzz,
    lookalikes,
    name_problems,
    names,
    namespace_splits,
    nfc,
    raw_names,
    unique_base,
)

BASE_LENGTH = len(unique_base())
MAX_ENTRIES = 30  # lease names per example: keeps an example to a few hundred round trips

_suffixes = st.one_of(
    st.just(""),
    names(MAX_NAMESPACE_LENGTH - BASE_LENGTH),
    names(MAX_NAMESPACE_LENGTH - BASE_LENGTH).map(lambda s: ":" + s[:-1]),
)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, str]]]:
    """Namespace suffixes, and ``(suffix index, name)`` entries: drawn names and, for
    each, the lookalikes that must be leases of their own."""
    suffixes = draw(st.lists(_suffixes, min_size=1, max_size=3, unique=True))
    entries: list[tuple[int, str]] = []
    for name in draw(st.lists(names(), min_size=1, max_size=4)):
        where = draw(st.integers(0, len(suffixes) - 1))
        entries += [(where, form) for form in (name, *lookalikes(name))]
    return suffixes, entries


def _valid(namespace: str, name: str) -> bool:
    return not name_problems(name) and not name_problems(namespace, limit=MAX_NAMESPACE_LENGTH)


def _plan(base: str, suffixes: list[str], entries: list[tuple[int, str]]) -> list[tuple[str, str]]:
    """The ``(namespace, name)`` pairs to acquire, in order, with each pair's splits at
    another colon; only valid ones, at most :data:`MAX_ENTRIES`."""
    plan: list[tuple[str, str]] = []
    for where, name in entries:
        namespace = base + suffixes[where]
        pairs = [(namespace, name), *namespace_splits(namespace, name)]
        plan += [pair for pair in pairs if pair[0].startswith(base) and _valid(*pair)]
    return plan[:MAX_ENTRIES]


def _check_round_trip_and_distinctness(
    store: SyncStore, case: tuple[list[str], list[tuple[int, str]]]
) -> None:
    base = unique_base()
    plan = _plan(base, *case)
    fleets: dict[str, Fleet] = {}
    leases: dict[tuple[str, str], Lease] = {}
    first_spelling: dict[tuple[str, str], tuple[str, str]] = {}
    try:
        for namespace, name in plan:
            key = (nfc(namespace), nfc(name))
            fleet = fleets.get(key[0]) or fleets.setdefault(
                key[0], Fleet(store, namespace=namespace)
            )
            lease = fleet.try_lock(name, lock_at_most="2m", keepalive=False)
            if key in leases:  # a spelling of a name already held: the same lock
                assert lease is None, f"{name!r} and {first_spelling[key]!r} are one name"
                continue
            others = [spelling for spelling in first_spelling.values() if spelling[0] == namespace]
            assert lease is not None, f"{(namespace, name)!r} shares a lease with one of {others!r}"
            assert (lease.record.namespace, lease.name) == key
            leases[key] = lease
            first_spelling[key] = (namespace, name)

        for index, ((namespace, name), lease) in enumerate(leases.items()):
            record = fleets[namespace].get(name)
            assert record is not None, (namespace, name)
            assert (record.namespace, record.name) == (namespace, name)
            assert (record.holder, record.fence, record.held) == (lease.holder, lease.fence, True)
            if index < 3:  # contention names the holder, never its secret token
                token = lease.holder.rpartition(":")[2]
                with pytest.raises(LockBusy) as busy:
                    fleets[namespace].lock(name, keepalive=False)
                assert busy.value.name == name
                assert busy.value.holder == lease.holder.rpartition(":")[0]
                assert token not in f"{busy.value} {busy.value!r} {busy.value.holder}"

        for namespace, fleet in fleets.items():
            mine = sorted(name for ns, name in leases if ns == namespace)
            listed = fleet.locks()
            assert [record.name for record in listed] == mine, namespace
            assert {(r.name, r.holder, r.fence) for r in listed} == {
                (name, lease.holder, lease.fence)
                for (ns, name), lease in leases.items()
                if ns == namespace
            }

        for (namespace, name), lease in leases.items():
            assert lease.release(), (namespace, name)
            record = fleets[namespace].get(name)
            assert record is not None
            assert not record.held
        for namespace in fleets:
            # Released rows become prunable once the store's clock has moved past their
            # release (SQLite's clock counts milliseconds): poll the dry run until then.
            mine = sorted(name for ns, name in leases if ns == namespace)
            wait_for(
                lambda: store.run(store.ops.lease_prune(namespace, 0, True)) == mine,  # noqa: B023
                timeout=5,
                interval=0.002,
                what=f"the released leases of {namespace!r} to be prunable",
            )
            assert store.run(store.ops.lease_prune(namespace, 0, False)) == mine, namespace
            assert store.run(store.ops.lease_list(namespace)) == []
    finally:
        for lease in leases.values():
            lease.release()
        for fleet in fleets.values():
            fleet.close()


def test_fuzzed_names_round_trip_exactly_and_never_share_a_lease(
    store: SyncStore, backend_url: str
) -> None:
    examples = budget(backend_url, sql=8, fast=25)
    fuzz(examples)(given(case=_cases())(_check_round_trip_and_distinctness))(store)


# -- refused names --------------------------------------------------------------------------
_BAD_INSERTS = ("\x00", "\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\x9f", "\ud800", "\udcff")
_SURROUNDING = (" ", "\t", "\n", "\u00a0", "\u3000", "\u2028", "\r\n")


@st.composite
def _bad_names(draw: st.DrawFn, limit: int) -> str:
    """Mostly invalid text: empty, a control character or lone surrogate inside, whitespace
    around, too long (also by one character, also of 4-byte characters)."""
    good = draw(names(limit))
    kind = draw(st.sampled_from(["empty", "insert", "surround", "long", "raw"]))
    if kind == "empty":
        return ""
    if kind == "insert":
        at = draw(st.integers(0, len(good)))
        return good[:at] + draw(st.sampled_from(_BAD_INSERTS)) + good[at:]
    if kind == "surround":
        space = draw(st.sampled_from(_SURROUNDING))
        return draw(st.sampled_from([space + good, good + space, space]))
    if kind == "long":
        filler = draw(st.sampled_from(["a", "🔒", "名", "e\u0301"]))
        return good + filler * (limit + 1 - len(good))
    return draw(raw_names)


@fuzz(max_examples=20)
@given(name=_bad_names(200), namespace=_bad_names(MAX_NAMESPACE_LENGTH))
def _check_refusals(store: SyncStore, name: str, namespace: str) -> None:
    base = unique_base()
    with Fleet(store, namespace=base) as fleet:
        problems = name_problems(name)
        if not problems:  # the oracle says it is valid: it must work, under its NFC form
            lease = fleet.try_lock(name, keepalive=False)
            assert lease is not None
            assert lease.name == nfc(name)
            assert lease.release()
        else:
            for attempt in (
                lambda: fleet.try_lock(name, keepalive=False),
                lambda: fleet.lock(name),
                lambda: fleet.locked(name),
                lambda: fleet.get(name),
            ):
                try:
                    attempt()
                except ConfigurationError as exc:
                    message = str(exc)
                else:
                    raise AssertionError(f"{name!r} was not refused")
                assert any(problem in message for problem in problems), (message, problems)
                assert "lock name" in message
                assert "\n" not in message, message  # one line: no log or output injection
                assert "\r" not in message, message
            assert fleet.locks() == []

    problems = name_problems(namespace, limit=MAX_NAMESPACE_LENGTH)
    if problems:
        try:
            Fleet(store, namespace=namespace)
        except ConfigurationError as exc:
            message = str(exc)
        else:
            raise AssertionError(f"namespace {namespace!r} was not refused")
        assert any(problem in message for problem in problems), (message, problems)
        assert "namespace" in message
        assert "\n" not in message, message


def test_names_and_namespaces_a_store_cannot_hold_are_refused_before_it_is_touched(
    store: SyncStore,
) -> None:
    _check_refusals(store)
