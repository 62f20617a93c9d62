"""The ``fleetcron`` logger. Every record that reports an event carries ``extra["action"]``.

:class:`JsonFormatter` writes one JSON object per line (``--log-format json``): the time
(ISO 8601, UTC), level, message, and every ``extra`` field of the record; a field named
``*_us`` holding an instant is accompanied by its ISO 8601 form without the suffix
(``slot_us`` → ``slot``), so a log pipeline never has to convert microseconds.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = [
    "LOG_FORMATS",
    "PROGRESS_JOBS",
    "PROGRESS_S",
    "JsonFormatter",
    "TextFormatter",
    "log",
    "says_progress",
]

log = logging.getLogger("fleetcron")

PROGRESS_JOBS = 1000
PROGRESS_S = 1.0


def says_progress(jobs: int, elapsed_s: float) -> bool:
    """Whether a step of a replica's start (reading the jobs file, registering) is worth a
    line of its own: over :data:`PROGRESS_JOBS` jobs, or over :data:`PROGRESS_S` seconds.
    A small jobs file starts with the one line that says what the replica runs."""
    return jobs > PROGRESS_JOBS or elapsed_s > PROGRESS_S


LOG_FORMATS = ("text", "json")

# What every LogRecord has: the rest are the ``extra`` fields of the call.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_EPOCH_2000_US = 946_684_800_000_000  # a *_us value above this is an instant, not a length


def _iso(moment_us: int) -> str:
    moment = datetime.fromtimestamp(moment_us / 1e6, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with its ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": _iso(round(record.created * 1e6)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD or key.startswith("_"):
                continue
            entry[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
            if key.endswith("_us") and isinstance(value, int) and value > _EPOCH_2000_US:
                entry.setdefault(key.removesuffix("_us"), _iso(value))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``[time ]fleetcron: message`` (the time for a daemon, whose lines are a history)."""

    def __init__(self, *, with_time: bool) -> None:
        fmt = "%(asctime)s fleetcron: %(message)s" if with_time else "fleetcron: %(message)s"
        super().__init__(fmt)
