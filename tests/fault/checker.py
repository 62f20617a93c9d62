"""The checker: judges a fault run's history (and the ledger) against fleetcron's promises.

``check(events, ledger=…, slots=…, allow=…, tolerance_us=…)`` runs six checks and returns a
:class:`Report`. Each check reports only **definite** violations: a history is judged by
what must have happened in *every* order of events consistent with it, so an ambiguous
ordering (two calls that overlap in monotonic time) or an indeterminate outcome
(``*_error``, or no outcome at all because the worker died) is never an anomaly.

Terms
-----
An *operation* is an ``X_invoke`` and the outcome that follows it from the same worker, for
the same name (and fence, when both carry one): it took effect somewhere in
``[invoke.mono, outcome.mono]``. An outcome without its invoke may have been invoked at any
earlier time; an invoke without an outcome may take effect at any later time.

A *holder* is ``(worker, name, fence)``. Its *answers* are the store's words about its
lease: ``acquire_ok`` and ``extend_ok`` (and, for the alive check only, a ``run_start``
that carries ``store_us`` and ``data.expires_us``): at store time ``s = store_us`` the lease
was the holder's until ``E = data.expires_us`` (a lease is free at its expiry). Each answer
gives the *validity interval* ``[s, E)`` in store time.

``tolerance_us`` widens every store-clock comparison by that much in the holder's favour
(SQLite and Redis answer in milliseconds: give at least 1000 there).

The rules
---------
1. ``overlap`` — two holders of one name valid at the same store time. For answers ``a``
   (holder A) and ``b`` (holder B ≠ A) with ``a.s <= b.s < a.E - tolerance``, the store
   said A holds over ``[a.s, a.E)`` and B holds at ``b.s``: an anomaly, unless a release
   of A may have taken effect between them — a ``release_invoke`` of A before ``b``'s
   outcome (mono) whose outcome (if any) is after ``a``'s invoke. (Equal ``s`` is checked
   both ways.) One anomaly per pair of holders. An extend that moved the expiry is its own
   answer with its own interval, so a grant inside an extended lease is caught and a
   grant after an extend's new expiry is not.
2. ``fence_order`` — fences per name strictly increase in grant order:
   (a) two grants (``acquire_ok``) with the same fence are an anomaly;
   (b) grant A definitely before grant B (A's outcome mono < B's invoke mono) with
   ``A.fence > B.fence`` is an anomaly — real time, whatever the store's clock did;
   (c) grants whose calls overlap in mono time are ordered by the store's clock: ``A.s <
   B.s - tolerance`` with ``A.fence > B.fence`` is an anomaly; equal store times are
   ambiguous and never one.
3. ``stale_write`` — (a) an accepted write (``write_ok``) whose fence is lower than that
   of a write accepted definitely before it (the other's ``write_ok`` mono < this one's
   ``write_invoke`` mono), per name; equal fences are fine; a ``write_error`` is not an
   accepted write. (b) A ``write_rejected`` followed by a ``write_invoke`` from the same
   worker, name and fence: a stale write was retried instead of reported.
4. ``alive_after_expiry`` — a sign of life (``alive``, ``run_alive``, ``write_invoke``) of
   holder A at mono ``m`` definitely after A's lease expired in the store. The store's
   clock at ``m`` is at least ``L(m) = m + max(s_k - o_k)`` over A's answers ``k`` received
   (outcome mono ``o_k``) by ``m``, since the store answered before it was heard and its
   clock runs at the rate of CLOCK_MONOTONIC. A's expiry at ``m`` is at most ``U(m)`` =
   the largest ``E_k`` of the answers invoked before ``m`` (an answer with no invoke
   counts), and of every indeterminate renewal (``extend_error``, or an ``extend_invoke``
   with no outcome) invoked before ``m``: that one may have taken effect as late as its
   outcome ``r``, giving at most ``min(s_k - v_k) + r + ttl`` (``ttl`` = the longest
   ``E_k - s_k``; an unanswered one, or one with no invoked answer to bound the clock,
   makes later signs unjudgeable). Anomaly iff ``L(m) > U(m) + tolerance``. Signs of a
   holder with no answer are not judged. One anomaly per holder (the first such sign).
5. ``slot_accounting`` — (with ``ledger`` and ``slots``) every expected slot of a job has
   exactly one ledger row, and it ended in one of ``ok_states`` (default ``succeeded``)
   or is ``missed``/``skipped`` with a non-empty reason (``error``); ``queued``/``running``
   is unfinished; a ``schedule``/``exec`` row for a slot of the job that is not expected
   but lies inside the expected window ``[min, max]`` is off the schedule (rows outside
   the window are not judged; jobs not in ``slots`` are not judged). Always (from the
   history): no slot has two runs (``worker, fence``) that both logged ``run_start`` and a
   successful ``run_end`` (``data.outcome`` ``ok``/``succeeded``).
6. ``early_start`` — a ledger row with ``started_us < slot_us - tolerance``, or a
   ``run_start`` with ``store_us < slot_us - tolerance`` (when ``store_us`` is known).

``allow`` names checks a scenario documents as not promised: their anomalies are reported
in ``Report.allowed`` and do not make the report fail.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fault.history import Event
from fleetcron.models import RunRecord

__all__ = ["CHECKS", "Anomaly", "Report", "check"]

CHECKS = (
    "overlap",
    "fence_order",
    "stale_write",
    "alive_after_expiry",
    "slot_accounting",
    "early_start",
)
"""The checks, by the name an anomaly's ``kind`` and ``allow`` use."""

_OPS = ("acquire", "extend", "release", "write")
_NEVER = float("inf")
_ALWAYS = float("-inf")
_SIGNS = frozenset({"alive", "run_alive", "write_invoke"})
_SUCCESS = frozenset({"ok", "succeeded"})
_SCHEDULED = frozenset({"schedule", "exec"})

Holder = tuple[str, str, int]
"""``(worker, name, fence)``."""


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One definite violation: the check (``kind``), which of its rules, what happened,
    and the events involved."""

    kind: str
    rule: str
    message: str
    events: tuple[Event, ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.kind} [{self.rule}]: {self.message}"]
        lines.extend(f"    {event.describe()}" for event in self.events)
        return "\n".join(lines)


@dataclass
class Report:
    """What :func:`check` found, and how much it checked."""

    anomalies: list[Anomaly] = field(default_factory=list)
    """Violations of checks that are promised: any makes the report fail."""
    allowed: list[Anomaly] = field(default_factory=list)
    """Violations of checks the scenario allows (reported, not counted)."""
    operations: int = 0
    """Operations (invoke + outcome) in the history."""
    grants: int = 0
    """Grants (``acquire_ok``)."""
    writes: int = 0
    """Protected writes judged (accepted + rejected)."""
    rejected: int = 0
    """Of those, writes the resource rejected as stale (a fence outrun by a newer one)."""
    slots: int = 0
    """Expected slots checked against the ledger."""
    signs: int = 0
    """Signs of life judged against their lease's expiry."""
    runs: int = 0
    """Distinct runs (``run_start``) in the history."""
    notes: list[str] = field(default_factory=list)
    """What could not be judged (unmatched outcomes, grants without an expiry, …)."""

    @property
    def ok(self) -> bool:
        """No anomaly outside ``allow``."""
        return not self.anomalies

    def kinds(self) -> Counter[str]:
        """How many anomalies of each kind (allowed ones not included)."""
        return Counter(anomaly.kind for anomaly in self.anomalies)

    def summary(self, limit: int = 5) -> str:
        """A few lines: the verdict, the counters, and the first ``limit`` anomalies."""
        counted = (
            f"{self.operations} operations, {self.grants} grants, {self.writes} writes, "
            f"{self.signs} signs of life, {self.runs} runs, {self.slots} slots checked"
        )
        if self.ok:
            head = f"ok — {counted}; no anomaly"
        else:
            kinds = ", ".join(f"{kind} ×{n}" for kind, n in sorted(self.kinds().items()))
            head = f"FAILED — {len(self.anomalies)} anomalies ({kinds}); {counted}"
        lines = [head]
        if self.allowed:
            allowed = Counter(anomaly.kind for anomaly in self.allowed)
            lines.append(
                "allowed: " + ", ".join(f"{kind} ×{n}" for kind, n in sorted(allowed.items()))
            )
        lines.extend(str(anomaly) for anomaly in self.anomalies[:limit])
        if len(self.anomalies) > limit:
            lines.append(f"… and {len(self.anomalies) - limit} more")
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


# -- operations ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Op:
    """An operation: its invoke (``None``: not logged) and its outcome (``None``: none)."""

    op: str
    invoke: Event | None
    outcome: Event | None

    @property
    def start(self) -> int | None:
        """Invoke mono; ``None``: unknown (any time before the outcome)."""
        return None if self.invoke is None else self.invoke.mono_us

    @property
    def end(self) -> int | None:
        """Outcome mono; ``None``: never (it may take effect at any later time)."""
        return None if self.outcome is None else self.outcome.mono_us

    @property
    def first(self) -> Event:
        event = self.invoke or self.outcome
        assert event is not None
        return event


def _pair(events: Sequence[Event]) -> list[_Op]:
    """Match every outcome with the latest open invoke of the same worker, name and
    operation (and fence when both have one)."""
    pending: dict[tuple[str, str, str], list[Event]] = defaultdict(list)
    ops: list[_Op] = []
    for event in events:
        op, _, phase = event.event.partition("_")
        if op not in _OPS:
            continue
        key = (event.worker, event.name, op)
        if phase == "invoke":
            pending[key].append(event)
            continue
        stack = pending[key]
        for index in range(len(stack) - 1, -1, -1):
            fence = stack[index].fence
            if fence is None or event.fence is None or fence == event.fence:
                ops.append(_Op(op, stack.pop(index), event))
                break
        else:
            ops.append(_Op(op, None, event))
    ops.extend(_Op(key[2], invoke, None) for key, stack in pending.items() for invoke in stack)
    ops.sort(key=lambda o: o.first.mono_us)
    return ops


@dataclass(frozen=True, slots=True)
class _Answer:
    """The store said: at store time ``s`` the lease is ``holder``'s until ``expires``."""

    holder: Holder
    s: int
    expires: int
    v: int | None  # invoke mono (None: unknown)
    o: int  # outcome mono
    event: Event


def _answer(op: _Op | None, event: Event) -> _Answer | None:
    expires = event.data.get("expires_us")
    if event.fence is None or event.store_us is None or not isinstance(expires, int):
        return None
    return _Answer(
        holder=(event.worker, event.name, event.fence),
        s=event.store_us,
        expires=expires,
        v=None if op is None else op.start,
        o=event.mono_us,
        event=event,
    )


def _asked(answer: _Answer) -> float:
    """When the call that got ``answer`` was made (``-inf``: unknown)."""
    return _ALWAYS if answer.v is None else answer.v


class _MinTree:
    """Static range-minimum tree over ``values``: finds every index in a range whose value
    is at most a threshold in O(log n) per index found."""

    def __init__(self, values: Sequence[float]) -> None:
        self.n = len(values)
        size = 1
        while size < max(self.n, 1):
            size *= 2
        self.size = size
        self.tree = [float("inf")] * (2 * size)
        self.tree[size : size + self.n] = values
        for node in range(size - 1, 0, -1):
            self.tree[node] = min(self.tree[2 * node], self.tree[2 * node + 1])

    def at_most(self, lo: int, hi: int, threshold: float) -> list[int]:
        """The indices ``i`` in ``[lo, hi)`` with ``values[i] <= threshold``, ascending."""
        found: list[int] = []
        if lo >= hi:
            return found
        stack = [(1, 0, self.size)]
        while stack:
            node, start, end = stack.pop()
            if end <= lo or start >= hi or self.tree[node] > threshold:
                continue
            if end - start == 1:
                found.append(start)
                continue
            middle = (start + end) // 2
            stack.append((2 * node + 1, middle, end))
            stack.append((2 * node, start, middle))
        return found


# -- the checker ---------------------------------------------------------------------------
class _Checker:
    def __init__(self, events: Sequence[Event], tolerance_us: int, allow: Collection[str]) -> None:
        self.events = sorted(events, key=lambda e: e.mono_us)
        self.tol = tolerance_us
        self.allow = allow
        self.report = Report()
        self.ops = _pair(self.events)
        self.report.operations = len(self.ops)
        self.answers: list[_Answer] = []  # acquire_ok and extend_ok
        self.grants: list[_Answer] = []
        self.releases: dict[Holder, list[_Op]] = defaultdict(list)
        self.extends: dict[Holder, list[_Op]] = defaultdict(list)
        incomplete = 0
        unmatched = Counter[str]()
        for op in self.ops:
            if op.invoke is None and op.outcome is not None:
                unmatched[op.outcome.event] += 1
            event = op.outcome
            if event is not None and event.event in ("acquire_ok", "extend_ok"):
                answer = _answer(op, event)
                if answer is None:
                    incomplete += 1
                    continue
                self.answers.append(answer)
                if event.event == "acquire_ok":
                    self.grants.append(answer)
            first = op.first
            if first.fence is not None:
                holder = (first.worker, first.name, first.fence)
                if op.op == "release":
                    self.releases[holder].append(op)
                elif op.op == "extend":
                    self.extends[holder].append(op)
        self.report.grants = sum(1 for e in self.events if e.event == "acquire_ok")
        if unmatched:
            listed = ", ".join(f"{kind} ×{n}" for kind, n in sorted(unmatched.items()))
            self.report.notes.append(f"outcomes without their invoke: {listed}")
        if incomplete:
            self.report.notes.append(
                f"{incomplete} acquire_ok/extend_ok without fence, store_us or "
                "data.expires_us (not judged)"
            )

    def add(self, kind: str, rule: str, message: str, *events: Event) -> None:
        anomaly = Anomaly(kind, rule, message, tuple(events))
        (self.report.allowed if kind in self.allow else self.report.anomalies).append(anomaly)

    # 1 ------------------------------------------------------------------------------------
    def _release_cutoff(self, answer: _Answer) -> float:
        """The earliest mono time at which a release of ``answer``'s holder may have taken
        effect after ``answer`` did: an answer of another holder heard *after* it may come
        after the release; one heard at or before it may not."""
        cutoff = _NEVER
        for op in self.releases.get(answer.holder, ()):
            if op.end is None or answer.v is None or op.end > answer.v:
                cutoff = min(cutoff, _ALWAYS if op.start is None else op.start)
        return cutoff

    def overlap(self) -> None:
        by_name: dict[str, list[_Answer]] = defaultdict(list)
        for answer in self.answers:
            by_name[answer.holder[1]].append(answer)
        for name, answers in by_name.items():
            answers.sort(key=lambda a: (a.s, a.o))
            starts = [a.s for a in answers]
            heard = _MinTree([a.o for a in answers])
            seen: set[frozenset[Holder]] = set()
            for a in answers:
                # Answers of others inside a's interval, heard before a release of a's
                # holder may have come: the store said both held the lease.
                lo = bisect.bisect_left(starts, a.s)
                hi = bisect.bisect_left(starts, a.expires - self.tol)
                for j in heard.at_most(lo, hi, self._release_cutoff(a)):
                    b = answers[j]
                    pair = frozenset((a.holder, b.holder))
                    if b.holder == a.holder or pair in seen:
                        continue
                    seen.add(pair)
                    self.add(
                        "overlap",
                        "two_holders",
                        f"{_who(a)} and {_who(b)} both held {name!r} at store time "
                        f"{_sec(b.s)}: the store gave {_who(a)} [{_sec(a.s)}, "
                        f"{_sec(a.expires)}) ({a.event.event}) and {_who(b)} {b.event.event} "
                        f"at {_sec(b.s)}, with no release of {_who(a)} that may have come "
                        "between",
                        a.event,
                        b.event,
                    )

    # 2 ------------------------------------------------------------------------------------
    def fence_order(self) -> None:
        by_name: dict[str, list[_Answer]] = defaultdict(list)
        for grant in self.grants:
            by_name[grant.holder[1]].append(grant)
        for name, grants in by_name.items():
            by_fence: dict[int, list[_Answer]] = defaultdict(list)
            for grant in grants:
                by_fence[grant.holder[2]].append(grant)
            for fence, same in sorted(by_fence.items()):
                if len(same) > 1:
                    self.add(
                        "fence_order",
                        "fence_reused",
                        f"fence {fence} of {name!r} was granted {len(same)} times",
                        *(g.event for g in same),
                    )
            grants.sort(key=lambda g: g.o)
            outcomes = [g.o for g in grants]
            best: list[_Answer] = []  # best[k]: the highest fence among grants[0..k]
            for grant in grants:
                best.append(grant if not best or grant.holder[2] > best[-1].holder[2] else best[-1])
            # Calls that overlap in mono time: A asked before B heard (A.v <= B.o) and
            # heard after B asked (A.o >= B.v). By ask time, then a tree over -heard.
            by_ask = sorted(grants, key=_asked)
            asks = [_asked(g) for g in by_ask]
            late = _MinTree([-g.o for g in by_ask])
            for b in grants:
                fence = b.holder[2]
                if b.v is not None:
                    before = bisect.bisect_left(outcomes, b.v)
                    if before and best[before - 1].holder[2] > fence:
                        a = best[before - 1]
                        self.add(
                            "fence_order",
                            "lower_after_higher",
                            f"{_who(b)} was granted {name!r} with fence {fence} after "
                            f"{_who(a)}'s grant with fence {a.holder[2]} had returned",
                            a.event,
                            b.event,
                        )
                asked = bisect.bisect_right(asks, b.o)
                threshold = _NEVER if b.v is None else -b.v
                for index in late.at_most(0, asked, threshold):
                    a = by_ask[index]
                    if a is not b and a.holder[2] > fence and a.s < b.s - self.tol:
                        self.add(
                            "fence_order",
                            "store_order",
                            f"{_who(a)} was granted {name!r} at store time {_sec(a.s)} with "
                            f"fence {a.holder[2]}, before {_who(b)} at {_sec(b.s)} with the "
                            f"lower fence {fence}, in calls that overlapped",
                            a.event,
                            b.event,
                        )

    # 3 ------------------------------------------------------------------------------------
    def stale_write(self) -> None:
        accepted: dict[str, list[_Op]] = defaultdict(list)
        rejected: list[_Op] = []
        invokes: dict[Holder, list[Event]] = defaultdict(list)
        for op in self.ops:
            if op.op != "write":
                continue
            invoke = op.invoke
            if invoke is not None and invoke.fence is not None:
                invokes[(invoke.worker, invoke.name, invoke.fence)].append(invoke)
            if op.outcome is None or op.outcome.fence is None:
                continue
            if op.outcome.event == "write_ok":
                accepted[op.outcome.name].append(op)
            elif op.outcome.event == "write_rejected":
                rejected.append(op)
        self.report.writes = sum(len(ops) for ops in accepted.values()) + len(rejected)
        self.report.rejected = len(rejected)
        for name, writes in accepted.items():
            writes.sort(key=lambda w: w.outcome.mono_us if w.outcome else 0)
            ends = [w.end or 0 for w in writes]
            best: list[_Op] = []
            for w in writes:
                best.append(w if not best or _fence(w) > _fence(best[-1]) else best[-1])
            for w in writes:
                if w.start is None:
                    continue
                before = bisect.bisect_left(ends, w.start)
                if before and _fence(best[before - 1]) > _fence(w):
                    high = best[before - 1]
                    assert high.outcome is not None
                    assert w.outcome is not None
                    self.add(
                        "stale_write",
                        "accepted_lower_fence",
                        f"{w.first.worker}'s write to {name!r} with fence {_fence(w)} was "
                        f"accepted after {high.first.worker}'s write with fence "
                        f"{_fence(high)} had been accepted",
                        high.outcome,
                        w.first,
                        w.outcome,
                    )
        for op in rejected:
            event = op.outcome
            assert event is not None
            assert event.fence is not None
            later = invokes.get((event.worker, event.name, event.fence), [])
            retry = next((e for e in later if e.mono_us > event.mono_us), None)
            if retry is not None:
                self.add(
                    "stale_write",
                    "retried_after_rejection",
                    f"{event.worker} retried a write to {event.name!r} with fence "
                    f"{event.fence} after it was rejected as stale",
                    event,
                    retry,
                )

    # 4 ------------------------------------------------------------------------------------
    def alive_after_expiry(self) -> None:
        answers: dict[Holder, list[_Answer]] = defaultdict(list)
        for answer in self.answers:
            answers[answer.holder].append(answer)
        for event in self.events:
            started = _answer(None, event) if event.event == "run_start" else None
            if started is not None:
                answers[started.holder].append(started)
        signs: dict[Holder, list[Event]] = defaultdict(list)
        for event in self.events:
            if event.event in _SIGNS and event.fence is not None:
                signs[(event.worker, event.name, event.fence)].append(event)
        unjudged = 0
        for holder, holder_signs in signs.items():
            mine = answers.get(holder)
            if not mine:
                unjudged += len(holder_signs)
                continue
            judged, late = self._judge_signs(holder, mine, holder_signs)
            self.report.signs += judged
            unjudged += len(holder_signs) - judged
            if late:
                sign, setter, by_us = late[0]
                self.add(
                    "alive_after_expiry",
                    "sign_after_expiry",
                    f"{holder[0]} showed life under {holder[1]!r} fence {holder[2]} "
                    f"({sign.event}) at mono {_sec(sign.mono_us)}, at least "
                    f"{by_us / 1000:.1f} ms after its lease had expired in the store "
                    f"(expiry set by the first event below; {len(late)} such signs)",
                    setter,
                    sign,
                )
        if unjudged:
            self.report.notes.append(
                f"{unjudged} signs of life not judged (no answer of their lease before them)"
            )

    def _judge_signs(
        self, holder: Holder, mine: list[_Answer], signs: list[Event]
    ) -> tuple[int, list[tuple[Event, Event, int]]]:
        """Judge each sign of ``holder`` (a sweep in mono order); return how many could be
        judged and the late ones as ``(sign, the answer that set the expiry, by how much it
        is late µs)``."""
        ttl = max(a.expires - a.s for a in mine)
        known = [a for a in mine if a.v is not None]
        # The store's clock at mono t is at most t + min(s_k - v_k) over answers asked at v_k.
        ceiling = min((a.s - a.v for a in known if a.v is not None), default=None)
        # Indeterminate renewals: (invoke mono, latest possible expiry; None: unbounded).
        pending: list[tuple[float, int | None]] = []
        for op in self.extends.get(holder, ()):
            if op.outcome is not None and op.outcome.event != "extend_error":
                continue
            start = _ALWAYS if op.start is None else op.start
            bound = None if op.end is None or ceiling is None else op.end + ceiling + ttl
            pending.append((start, bound))
        pending.sort(key=lambda p: p[0])
        by_heard = sorted(mine, key=lambda a: a.o)
        by_asked = sorted(mine, key=_asked)
        offset: int | None = None  # max(s_k - o_k) over the answers heard so far
        setter: _Answer | None = None  # the answer with the latest expiry asked so far
        unbounded, extra = False, -(2**62)  # the indeterminate renewals asked so far
        i = j = k = 0
        judged = 0
        late: list[tuple[Event, Event, int]] = []
        for sign in sorted(signs, key=lambda e: e.mono_us):
            m = sign.mono_us
            while i < len(by_heard) and by_heard[i].o <= m:
                gap = by_heard[i].s - by_heard[i].o
                offset = gap if offset is None else max(offset, gap)
                i += 1
            while j < len(by_asked) and _asked(by_asked[j]) < m:
                if setter is None or by_asked[j].expires > setter.expires:
                    setter = by_asked[j]
                j += 1
            while k < len(pending) and pending[k][0] < m:
                bound = pending[k][1]
                unbounded = unbounded or bound is None
                extra = max(extra, bound if bound is not None else extra)
                k += 1
            if offset is None or setter is None or unbounded:
                continue
            judged += 1
            expiry = max(setter.expires, extra)
            if m + offset > expiry + self.tol:
                late.append((sign, setter.event, m + offset - expiry))
        return judged, late

    # 5 and 6 --------------------------------------------------------------------------------
    def runs(
        self,
        ledger: Sequence[RunRecord] | None,
        slots: Mapping[str, Collection[int]] | None,
        ok_states: Collection[str],
    ) -> None:
        started: dict[tuple[str, int, str, int], Event] = {}
        succeeded: dict[tuple[str, int, str, int], Event] = {}
        for event in self.events:
            if event.slot_us is None or event.fence is None:
                continue
            run = (event.name, event.slot_us, event.worker, event.fence)
            if event.event == "run_start":
                started.setdefault(run, event)
                if event.store_us is not None and event.store_us < event.slot_us - self.tol:
                    self.add(
                        "early_start",
                        "run_start_before_slot",
                        f"{event.worker} started {event.name!r} slot {_sec(event.slot_us)} at "
                        f"store time {_sec(event.store_us)}",
                        event,
                    )
            elif event.event == "run_end" and event.data.get("outcome") in _SUCCESS:
                succeeded.setdefault(run, event)
        self.report.runs = len(started)
        done: dict[tuple[str, int], list[tuple[str, int, str, int]]] = defaultdict(list)
        for run in started:
            if run in succeeded:
                done[run[:2]].append(run)
        for (job, slot), runs in sorted(done.items()):
            if len(runs) > 1:
                self.add(
                    "slot_accounting",
                    "double_run",
                    f"slot {_sec(slot)} of {job!r} ran to success {len(runs)} times",
                    *(e for run in runs for e in (started[run], succeeded[run])),
                )
        if ledger is None:
            return
        for row in ledger:
            if row.started_us is not None and row.started_us < row.slot_us - self.tol:
                self.add(
                    "early_start",
                    "ledger_started_before_slot",
                    f"ledger row of {row.job!r} slot {_sec(row.slot_us)} started at store time "
                    f"{_sec(row.started_us)} (attempt {row.attempt}, fence {row.fence})",
                )
        if slots is None:
            return
        for job, expected in slots.items():
            self._account(job, set(expected), [r for r in ledger if r.job == job], ok_states)

    def _account(
        self, job: str, expected: set[int], rows: list[RunRecord], ok_states: Collection[str]
    ) -> None:
        self.report.slots += len(expected)
        by_slot: dict[int, list[RunRecord]] = defaultdict(list)
        for row in rows:
            by_slot[row.slot_us].append(row)
        for slot in sorted(expected):
            found = by_slot.get(slot, [])
            where = f"slot {_sec(slot)} of {job!r}"
            if not found:
                self.add("slot_accounting", "no_row", f"{where} has no ledger row")
                continue
            if len(found) > 1:
                self.add("slot_accounting", "duplicate_rows", f"{where} has {len(found)} rows")
                continue
            row = found[0]
            if row.state in ok_states:
                continue
            if row.state in ("missed", "skipped"):
                if not (row.error or "").strip():
                    self.add(
                        "slot_accounting", "no_reason", f"{where} is {row.state} with no reason"
                    )
            elif row.state in ("queued", "running"):
                self.add("slot_accounting", "unfinished", f"{where} is still {row.state}")
            else:
                self.add(
                    "slot_accounting",
                    "bad_outcome",
                    f"{where} ended {row.state} (attempt {row.attempt}): {row.error or ''}",
                )
        if expected:
            low, high = min(expected), max(expected)
            for slot, found in sorted(by_slot.items()):
                stray = [r for r in found if r.trigger in _SCHEDULED]
                if slot not in expected and low <= slot <= high and stray:
                    self.add(
                        "slot_accounting",
                        "off_schedule",
                        f"{job!r} has a {stray[0].trigger} row for slot {_sec(slot)}, which is "
                        "not in its schedule",
                    )


def _fence(op: _Op) -> int:
    assert op.outcome is not None
    assert op.outcome.fence is not None
    return op.outcome.fence


def _who(answer: _Answer) -> str:
    return f"{answer.holder[0]} (fence {answer.holder[2]})"


def _sec(micros: int) -> str:
    return f"{micros / 1e6:.6f}s"


def check(
    events: Iterable[Event],
    *,
    ledger: Sequence[RunRecord] | None = None,
    slots: Mapping[str, Collection[int]] | None = None,
    allow: Collection[str] = frozenset(),
    tolerance_us: int = 0,
    ok_states: Collection[str] = frozenset({"succeeded"}),
) -> Report:
    """Judge a history (see the module docstring for the rules).

    ``ledger``: the ledger rows read at the end of the run; ``slots``: the expected slots
    per job in the checked window (both needed for the slot accounting); ``allow``: checks
    (:data:`CHECKS`) whose anomalies are reported as allowed; ``tolerance_us``: slack in
    the holder's favour on every store-clock comparison; ``ok_states``: the ledger states
    a slot may end in (``missed``/``skipped`` with a reason always may).
    """
    unknown = set(allow) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks in allow: {sorted(unknown)}; known: {CHECKS}")
    if tolerance_us < 0:
        raise ValueError("tolerance_us must not be negative")
    checker = _Checker(list(events), tolerance_us, frozenset(allow))
    checker.overlap()
    checker.fence_order()
    checker.stale_write()
    checker.alive_after_expiry()
    checker.runs(ledger, slots, ok_states)
    return checker.report
