"""Asking a job's running attempts to stop: what ``fleetcron cancel``,
:meth:`AsyncFleet.cancel <fleetcron.fleet.AsyncFleet.cancel>` and the dashboard's Cancel
share.

A request is a mark in the ledger, not a signal: it sets the attempt's
``cancel_requested`` and writes ``cancelled by WHO`` as its error
(:meth:`~fleetcron.stores.base.Operations.run_cancel`). The replica running the attempt
notices within about a second and stops it as it would on a lost lease (a command: SIGTERM
to its process group, SIGKILL after the kill grace; a function: ``ctx.cancelled`` and
:class:`~fleetcron.errors.RunCancelled`), then records it ``cancelled`` with that error. Only
an attempt whose lease has not expired is asked; one asked before is asked again.
"""

from __future__ import annotations

import getpass
import socket
import unicodedata
from datetime import datetime
from typing import Final

from fleetcron.errors import ConfigurationError
from fleetcron.schedules import from_datetime
from fleetcron.slot_lease import CANCEL_NOTE_PREFIX
from fleetcron.stores.base import Operation, Operations

__all__ = [
    "MAX_REQUESTER_LENGTH",
    "cancel_note",
    "cancel_runs",
    "default_requester",
    "requested_slot",
    "unknown_job",
]

MAX_REQUESTER_LENGTH: Final = 200
"""The longest ``by`` a request takes: it is shown in the ledger's error column."""


def default_requester() -> str:
    """``user@host`` of this process: who asked, when the caller does not say."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry (containers) and no $USER
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def cancel_note(by: object, where: str = "by") -> str:
    """``cancelled by BY``: the note a request writes, which the stopped run's outcome
    keeps as its error. ``by`` must be one line of printable text of at most
    :data:`MAX_REQUESTER_LENGTH` characters: else a :class:`ConfigurationError` naming
    ``where`` (the parameter or option it came from)."""
    if not isinstance(by, str):
        raise ConfigurationError(f"{where} must be a string, not {type(by).__name__}")
    who = by.strip()
    if not who:
        raise ConfigurationError(f"{where} must name who asks the run to stop; it is empty")
    if len(who) > MAX_REQUESTER_LENGTH:
        raise ConfigurationError(
            f"{where} must be at most {MAX_REQUESTER_LENGTH} characters, got {len(who)}"
        )
    # A control or format character would forge a line, or hide text, in every log and
    # table that shows the ledger's error; a lone surrogate (undecodable argv) cannot be
    # stored at all.
    if any(unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp") for char in who):
        raise ConfigurationError(f"{where} must be printable text on one line, not {who!r}")
    return f"{CANCEL_NOTE_PREFIX}{who}"


def requested_slot(slot: object) -> int | None:
    """The slot a request names (an aware datetime) in µs, or ``None`` for every running
    attempt of the job; a :class:`ConfigurationError` for anything else."""
    if slot is None:
        return None
    if not isinstance(slot, datetime):
        raise ConfigurationError(f"slot must be a datetime, not {type(slot).__name__}")
    return from_datetime(slot)  # a naive datetime is refused: it names no instant


def unknown_job(job: str, namespace: str) -> ConfigurationError:
    """The error of a request for a job the store does not know (as ``trigger`` says it)."""
    return ConfigurationError(
        f"no job {job!r} in namespace {namespace!r} (jobs register when a replica runs)"
    )


def cancel_runs(
    ops: Operations, namespace: str, job: str, slot_us: int | None, note: str
) -> Operation[int | None]:
    """Ask ``job``'s running attempts (of ``slot_us`` only, when given) to stop, writing
    ``note``: how many were asked, or ``None`` when the store does not know the job."""
    if (yield from ops.job_get(namespace, job)) is None:
        return None
    asked: int = yield from ops.run_cancel(namespace, job, slot_us, note)
    return asked
