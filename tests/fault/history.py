"""The history of a fault run: what every worker did and when, as JSON lines.

Each worker (process, or a scheduler replica's job) writes its own file through a
:class:`HistoryWriter`; :func:`read_history` merges the files into one list of
:class:`Event` sorted by ``mono_us``, which :func:`fault.checker.check` judges.

Times:

- ``mono_us`` is ``time.monotonic_ns() // 1000`` when the event was logged, stamped by
  :meth:`HistoryWriter.log` itself. CLOCK_MONOTONIC is system-wide on Linux, so the values
  of different processes on this host are comparable (workers under libfaketime run with
  ``DONT_FAKE_MONOTONIC=1``).
- ``store_us`` is the store's clock in the answer the event records (a grant's
  ``acquired_us``, an extend's ``now_us``), never the worker's wall clock.

An operation is logged as ``*_invoke`` before the call and one outcome after it, so the
checker knows the interval of monotonic time in which it took effect. ``extend_invoke``,
``release_invoke`` and ``write_invoke`` carry the fence of the lease they act for; the
outcomes carry the fields listed in :data:`EVENTS`.

Each line is written with one ``write(2)`` on a file opened ``O_APPEND`` and no buffering
in between, so a worker killed with SIGKILL loses nothing it logged; a line cut short by
a crash in the middle of that write is the last line of its file, and :func:`read_history`
drops it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["EVENTS", "Event", "HistoryWriter", "read_history"]

EVENTS: dict[str, str] = {
    # locks (name = lease name)
    "acquire_invoke": "about to ask for the lease",
    "acquire_ok": "granted: fence, store_us = acquired_us, data.expires_us, data.holder",
    "acquire_refused": "the store said another holder has it",
    "acquire_error": "indeterminate: the lease may have been granted",
    "extend_invoke": "about to renew (fence)",
    "extend_ok": "renewed: fence, store_us = the answer's now_us, data.expires_us",
    "extend_lost": "the store said the lease is no longer ours",
    "extend_error": "indeterminate: the renewal may have taken effect",
    "release_invoke": "about to release (fence)",
    "release_ok": "released",
    "release_lost": "the store no longer knew the lease as ours",
    "release_error": "indeterminate: the release may have taken effect",
    # the protected resource
    "write_invoke": "about to write to the protected resource (fence; slot_us for a run)",
    "write_ok": "the write was accepted (fence)",
    "write_rejected": "the write was refused as stale (fence, data.highest)",
    "write_error": "indeterminate: the write may have been accepted",
    # signs of the holder
    "alive": "a sign of life of the holder while it believes it holds the lease (fence)",
    "stopped": "the holder stopped working under the lease (fence)",
    # scheduler runs (name = job, slot_us = the slot, fence = the run's fence)
    "run_start": "the job body started (store_us and data.expires_us when known)",
    "run_alive": "a sign of life of the job body",
    "run_end": "the job body ended (data.outcome)",
}
"""Every event a history may hold, with what it means and the fields it carries."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One line of a history."""

    mono_us: int
    """``time.monotonic_ns() // 1000`` when the event happened (comparable across processes)."""
    worker: str
    """The process (or replica) that logged it."""
    name: str
    """The lease name, or the job name of a scheduler run."""
    event: str
    """One of :data:`EVENTS`."""
    store_us: int | None = None
    """The store's clock in the answer this event records."""
    fence: int | None = None
    slot_us: int | None = None
    data: dict[str, Any] = field(default_factory=dict)
    """JSON-able extras (``expires_us``, ``holder``, ``outcome``, ``error``, …)."""

    def as_json(self) -> dict[str, Any]:
        """The event as a JSON object (``None`` fields and empty data left out)."""
        out: dict[str, Any] = {
            "mono_us": self.mono_us,
            "worker": self.worker,
            "name": self.name,
            "event": self.event,
        }
        for key in ("store_us", "fence", "slot_us"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.data:
            out["data"] = self.data
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Event:
        """The event of one parsed history line (raises ``KeyError``/``TypeError`` if it is
        not one)."""
        data = obj.get("data") or {}
        if not isinstance(data, dict):
            raise TypeError(f"data must be an object, not {type(data).__name__}")
        return cls(
            mono_us=int(obj["mono_us"]),
            worker=str(obj["worker"]),
            name=str(obj["name"]),
            event=str(obj["event"]),
            store_us=_optional_int(obj.get("store_us")),
            fence=_optional_int(obj.get("fence")),
            slot_us=_optional_int(obj.get("slot_us")),
            data=data,
        )

    def describe(self) -> str:
        """A short line for a report: who, what, fence, and the times (seconds)."""
        parts = [f"{self.worker} {self.event} {self.name!r}"]
        if self.fence is not None:
            parts.append(f"fence={self.fence}")
        if self.slot_us is not None:
            parts.append(f"slot={_seconds(self.slot_us)}")
        parts.append(f"mono={_seconds(self.mono_us)}")
        if self.store_us is not None:
            parts.append(f"store={_seconds(self.store_us)}")
        expires = self.data.get("expires_us")
        if isinstance(expires, int):
            parts.append(f"expires={_seconds(expires)}")
        return " ".join(parts)


def _seconds(micros: int) -> str:
    return f"{micros / 1e6:.6f}s"


def _optional_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


class HistoryWriter:
    """Appends one worker's events to ``path`` (created if missing), one JSON line each.

    Thread-safe: the time stamp and the write happen under one lock, so a file's lines are
    in ``mono_us`` order. Several processes may append to one file (each line is a single
    ``O_APPEND`` write), though one file per process is the rule.
    """

    def __init__(self, path: str | os.PathLike[str], worker: str) -> None:
        self.path = Path(path)
        self.worker = worker
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def log(
        self,
        event: str,
        name: str,
        *,
        store_us: int | None = None,
        fence: int | None = None,
        slot_us: int | None = None,
        **data: Any,
    ) -> Event:
        """Stamp ``mono_us`` now, write the event and return it. ``event`` must be one of
        :data:`EVENTS`; ``data`` must be JSON-able."""
        if event not in EVENTS:
            raise ValueError(f"unknown history event {event!r}")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"history {self.path} is closed")
            entry = Event(
                mono_us=time.monotonic_ns() // 1000,
                worker=self.worker,
                name=name,
                event=event,
                store_us=store_us,
                fence=fence,
                slot_us=slot_us,
                data=data,
            )
            line = json.dumps(entry.as_json(), separators=(",", ":"), sort_keys=True) + "\n"
            os.write(self._fd, line.encode())
        return entry

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_history(paths: Iterable[str | os.PathLike[str]]) -> list[Event]:
    """Merge the history files ``paths`` into one list sorted by ``mono_us`` (ties keep the
    order of the files, then of the lines).

    A last line without its newline that does not parse is the write a SIGKILL cut short:
    it is dropped. Any other line that does not parse raises ``ValueError`` naming the file
    and line.
    """
    events: list[Event] = []
    for path in paths:
        raw = Path(path).read_bytes()
        lines = raw.split(b"\n")
        complete = raw.endswith(b"\n") or not raw
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            last = number == len(lines)
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise TypeError("a history line must be a JSON object")
                events.append(Event.from_json(obj))
            except (ValueError, KeyError, TypeError) as exc:
                if last and not complete:
                    break  # the write a crash cut short
                raise ValueError(f"{path}:{number}: not a history event: {exc}") from exc
    events.sort(key=lambda e: e.mono_us)
    return events
