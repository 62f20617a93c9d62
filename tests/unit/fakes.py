"""Test doubles shared by the unit tests of the store operations."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any, TypeVar

from fleetcron.local_holder import LocalHolder
from fleetcron.stores.base import Operation, Statement
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore

T = TypeVar("T")

HERE = LocalHolder(scope="boot-1 pid:[1] time:[2]", pid=100, start=5_000, group=100)
HOLDER_COLUMNS = ("holder", "fence", "holder_pid", "holder_start", "holder_group")
"""The columns of SQLite's ``lease_holder`` answer."""


class GoneHolders:
    """A host (:class:`~fleetcron.local_holder.Locality`) on which this process is
    ``me`` and every other holder is gone — or none, with ``gone=False``. ``asked``: the
    holders it was asked about."""

    def __init__(self, *, gone: bool = True, me: LocalHolder | None = HERE) -> None:
        self.me = me
        self.is_gone = gone
        self.asked: list[LocalHolder] = []

    def holder(self) -> LocalHolder | None:
        return self.me

    def gone(self, holder: LocalHolder) -> bool:
        self.asked.append(holder)
        return self.is_gone


class FakeExecute:
    """Records every statement and answers each with the next canned result."""

    def __init__(self, *answers: Any) -> None:
        self.answers: Iterator[Any] = iter(answers)
        self.statements: list[Statement] = []

    def __call__(self, statement: Statement) -> Any:
        self.statements.append(statement)
        return next(self.answers)

    @property
    def names(self) -> list[str]:
        """The name of each statement (``scan`` for a key scan)."""
        return [getattr(statement, "name", "scan") for statement in self.statements]


class Recorded(AsyncMemoryStore):
    """The async face of a memory store that notes every operation it runs: ``calls[name]``
    holds the arguments of each call (the operation's parameters, read before it runs) and
    ``answers[name]`` what each answered. ``recording`` turns the notes off and on."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.calls: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        self.answers: defaultdict[str, list[Any]] = defaultdict(list)
        self.recording = True

    async def run(self, operation: Operation[T]) -> T:
        name = getattr(operation, "__name__", "")
        recording = self.recording
        if recording:
            self.calls[name].append(dict(operation.gi_frame.f_locals))  # type: ignore[attr-defined]
        result = await super().run(operation)
        if recording:
            self.answers[name].append(result)
        return result
