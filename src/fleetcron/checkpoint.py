"""A job's checkpoint (high-water mark): ``ctx.checkpoint``.

A job that must cover every interval cannot assume "since the last tick": ticks are
skipped, missed and retried. It keeps a high-water mark instead — the last id or time it
processed — in the store, and resumes from it. The checkpoint moves only under a fence at
least as high as the one that last moved it, so a stale run (paused past its lease while
a newer run went on) cannot move it back: its ``set`` raises
:class:`~fleetcron.fencing.StaleFence` and changes nothing.

Values are JSON (a number, a string, a dict…). ``get``/``set`` are for a job's function
running in a thread (a plain ``def``); ``aget``/``aset`` for an ``async def``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fleetcron.bridge import call_on_loop
from fleetcron.fencing import StaleFence
from fleetcron.jsonvalue import encode_json
from fleetcron.stores.base import AsyncStore

__all__ = ["Checkpoint"]

MAX_CHECKPOINT_BYTES = 65_536


def _encode(value: Any) -> str:
    return encode_json(
        value,
        where="the checkpoint",
        limit=MAX_CHECKPOINT_BYTES,
        too_big="keep the mark — an id, a time — not the data",
    )


class Checkpoint:
    """The checkpoint of one job, for one run (its fence)."""

    def __init__(
        self,
        store: AsyncStore,
        namespace: str,
        name: str,
        fence: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._store = store
        self._namespace = namespace
        self.name = name
        self.fence = fence
        self._loop = loop

    async def aget(self, default: Any = None) -> Any:
        """The checkpoint's value, or ``default`` when it was never set."""
        found = await self._store.run(self._store.ops.checkpoint_get(self._namespace, self.name))
        return default if found is None else json.loads(found.value)

    async def aset(self, value: Any) -> None:
        """Move the checkpoint to ``value`` under this run's fence; raises
        :class:`~fleetcron.fencing.StaleFence` (changing nothing) when a newer run of the
        job has moved it since."""
        text = _encode(value)
        ops = self._store.ops
        if await self._store.run(ops.checkpoint_set(self._namespace, self.name, self.fence, text)):
            return
        found = await self._store.run(ops.checkpoint_get(self._namespace, self.name))
        raise StaleFence(f"checkpoint {self.name}", self.fence, found.fence if found else 0)

    def get(self, default: Any = None) -> Any:
        """:meth:`aget` from a job function running in a thread."""
        return call_on_loop(self._loop, self.aget(default), instead="`await ctx.checkpoint.aget()`")

    def set(self, value: Any) -> None:
        """:meth:`aset` from a job function running in a thread."""
        call_on_loop(self._loop, self.aset(value), instead="`await ctx.checkpoint.aset(value)`")
