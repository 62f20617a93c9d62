"""Test doubles shared by the unit tests of the store operations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleetcron.stores.base import Statement


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
