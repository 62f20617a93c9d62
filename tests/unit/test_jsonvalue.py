"""The JSON values fleetcron stores (queue items, checkpoints): how deep they may nest.

``json.dumps`` recurses once per level, so a value a thousand lists deep was a
RecursionError wherever it was put; it is a ConfigurationError naming the value and the
limit, whatever the caller's stack, and a value at the limit is encoded as always.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from fleetcron.checkpoint import Checkpoint
from fleetcron.errors import ConfigurationError
from fleetcron.jsonvalue import MAX_JSON_DEPTH, encode_json
from fleetcron.stores.memory import AsyncMemoryStore


def nested(depth: int, leaf: Any = None) -> Any:
    """``[[…[leaf]…]]``, ``depth`` lists deep."""
    value: Any = [] if leaf is None else [leaf]
    for _ in range(depth - 1):
        value = [value]
    return value


def encode(value: Any) -> str:
    return encode_json(value, where="item 7", limit=1_048_576, too_big="smaller")


@pytest.mark.parametrize(
    "value",
    [
        nested(MAX_JSON_DEPTH),
        {"a": nested(MAX_JSON_DEPTH - 1)},
        (nested(MAX_JSON_DEPTH - 1),),
        ["[" * 500 + "{" * 500],  # brackets in a string are no depth
        [nested(MAX_JSON_DEPTH - 1, leaf=n) for n in range(1_000)],  # wide, not deep
    ],
    ids=["lists", "object", "tuple", "brackets-in-text", "wide"],
)
def test_a_value_as_deep_as_the_limit_is_encoded(value: Any) -> None:
    assert encode(value).startswith(("[", "{"))


@pytest.mark.parametrize(
    "value",
    [
        nested(MAX_JSON_DEPTH + 1),
        nested(1_000),
        nested(100_000),
        {"a": [{"b": nested(MAX_JSON_DEPTH - 2)}]},
        [1, "x", {"k": nested(MAX_JSON_DEPTH)}],
    ],
    ids=["101", "1000", "100000", "objects-and-lists", "one-branch"],
)
def test_a_value_deeper_than_the_limit_is_refused_naming_it_and_the_limit(value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        encode(value)
    assert caught.value.message == (
        "item 7 is nested too deep: lists and objects may nest at most 100 levels deep"
    )


def test_the_limit_does_not_depend_on_how_deep_the_callers_stack_is() -> None:
    def at_depth(frames: int) -> str:
        if frames:
            return at_depth(frames - 1)
        try:
            return encode(nested(MAX_JSON_DEPTH + 1))
        except ConfigurationError as exc:
            return exc.message

    # Most of the recursion limit used up already: json.dumps runs out of stack at once.
    deep_caller = sys.getrecursionlimit() - 60
    assert "nested too deep" in at_depth(deep_caller)


def test_a_cycle_is_refused_as_one() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ConfigurationError, match="Circular reference"):
        encode(loop)


async def test_a_checkpoint_nested_too_deep_is_refused_and_nothing_is_stored() -> None:
    store = AsyncMemoryStore()
    checkpoint = Checkpoint(store, "ns", "feed", 3, asyncio.get_running_loop())

    with pytest.raises(ConfigurationError, match=r"^the checkpoint is nested too deep"):
        await checkpoint.aset({"ids": nested(1_000)})

    assert await store.run(store.ops.checkpoint_get("ns", "feed")) is None
