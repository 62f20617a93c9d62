"""The rules every lease holder follows: renewal times, the local deadline, and the stop
sequence of the work it protects.

One set of rules serves the lock API (:class:`~fleetcron.lease.Lease`,
:class:`~fleetcron.lease.AsyncLease`), a claimed slot (``fleetcron exec --schedule``,
:class:`~fleetcron.slot_lease.SlotLease`) and every run of the scheduler
(:class:`~fleetcron.slot_lease.AsyncSlotLease`):

- **Renew** every ``lock_at_most / 3``, counted from the time the last successful request
  was *sent*.
- **Local deadline** = send time of the acquire (or of the last successful renewal) +
  ``lock_at_most`` − :func:`safety_margin_us`, on the monotonic clock. The store's expiry
  is that send time + ``lock_at_most`` by the store's clock or later, so a holder that
  has stopped by its deadline has stopped before anybody else can be granted the lease.
- **A failed renewal** is retried sooner (:func:`retry_interval_s`); the lease is lost
  when a renewal is refused or the deadline passes without a successful one.
- **An outcome the store failed to take** is tried again (:func:`finish_retry_pause_us`)
  while the fence can still be current: until the lease's nominal end (the local deadline
  plus the margin), the earliest the store can expire it. The tries are at most
  :data:`FINISH_RETRY_MOST_S` apart, and the stretch just before the local deadline always
  has one, so a store back from an outage shorter than the lease takes the outcome.
- **The stop sequence** (:func:`stop_points`): the protected work is asked to stop (SIGTERM
  to a command's process group, a cancellation to Python code) ``kill_grace`` before the
  deadline, and killed (SIGKILL) at the deadline at the latest. A stop asked for another
  reason (timeout, shutdown, cancel requested) gets the grace, but never past the deadline.
  A process group's stop points are also handed to the reaper (:mod:`fleetcron.reaper`),
  which keeps them when the process supervising the work is frozen or dead.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "FINISH_RETRY_MOST_S",
    "StopPoints",
    "backoff_s",
    "describe_failure",
    "effective_grace_us",
    "finish_retry_pause_us",
    "local_deadline_us",
    "renew_interval_s",
    "retry_interval_s",
    "safety_margin_us",
    "stop_points",
]

_MAX_MARGIN_US = 2_000_000
_MIN_RETRY_S = 0.05
_LAST_CALL_LEAD_US = 100_000

FINISH_RETRY_MOST_S = 0.5
"""The longest wait between two tries to record an outcome: an outage ends unseen for at
most this long (a back-off grown to seconds would sleep through the end of the lease)."""


def safety_margin_us(ttl_us: int) -> int:
    """How long before the lease's nominal end the holder stops trusting it:
    a tenth of the lease, at most 2 s."""
    return min(ttl_us // 10, _MAX_MARGIN_US)


def local_deadline_us(sent_us: int, ttl_us: int) -> int:
    """The monotonic time after which a lease granted (or renewed) by a request sent at
    ``sent_us`` is no longer trusted."""
    return sent_us + ttl_us - safety_margin_us(ttl_us)


def renew_interval_s(ttl_us: int) -> float:
    """Seconds between renewals while they succeed."""
    return ttl_us / 3 / 1e6


def retry_interval_s(interval_s: float, remaining_us: int) -> float:
    """After a failed renewal, try again sooner: a quarter of what is left before the
    deadline (at least 50 ms), so a brief outage is retried before the deadline passes."""
    return max(_MIN_RETRY_S, min(interval_s, remaining_us / 4 / 1e6))


def backoff_s(attempt: int, *, first_s: float = 0.1, most_s: float = 5.0) -> float:
    """The wait before try ``attempt + 1`` of something the store failed: ``first_s``
    doubling to ``most_s``, with jitter so that replicas do not retry in step."""
    ceiling = min(most_s, first_s * float(2 ** min(attempt, 16)))
    return random.uniform(ceiling / 2, ceiling)


def finish_retry_pause_us(
    attempt: int, *, now_us: int, deadline_us: int, ttl_us: int
) -> int | None:
    """The wait before try ``attempt + 2`` to record an outcome of a lease whose local
    deadline is ``deadline_us`` (monotonic), or ``None`` when no later try can reach the
    store while the fence may be current.

    Tries go on until the lease's nominal end, ``deadline_us`` + the safety margin: the
    store expires the lease no earlier (its expiry counts from when it *received* the
    request whose send time set the deadline), and it refuses an outcome once expired, so
    a late try is safe and an early give-up loses an outcome the store would have taken.
    The waits back off from 50 ms to :data:`FINISH_RETRY_MOST_S`, and one try falls just
    before the local deadline (a tenth of a second or half the margin before it, whichever
    is less) however the back-off falls.
    """
    margin = safety_margin_us(ttl_us)
    horizon = deadline_us + margin
    pause = round(backoff_s(attempt, first_s=0.05, most_s=FINISH_RETRY_MOST_S) * 1e6)
    last_call = deadline_us - min(_LAST_CALL_LEAD_US, margin // 2)
    if now_us < last_call < now_us + pause:
        pause = last_call - now_us
    if now_us + pause >= horizon:
        return None
    return pause


def describe_failure(exc: BaseException) -> str:
    """A renewal's failure as text for the log: never empty (a timeout has no message)."""
    text = str(exc).strip()
    if text:
        return text
    if isinstance(exc, TimeoutError):
        return "timed out: no answer from the store before the local deadline"
    return type(exc).__name__


def effective_grace_us(kill_grace_us: int, ttl_us: int) -> int:
    """The grace between SIGTERM and SIGKILL for a lease of ``ttl_us``: a grace as long
    as the lease would stop the work at once, so it is clamped to a sixth of the lease."""
    return max(0, min(kill_grace_us, ttl_us // 6))


@dataclass(frozen=True, slots=True)
class StopPoints:
    """When to ask the work to stop and when to kill it (monotonic µs; ``None``: not yet)."""

    term_at: int | None
    kill_at: int | None


def stop_points(*, deadline_us: int | None, grace_us: int, asked_at_us: int | None) -> StopPoints:
    """The stop sequence for work under a lease with local deadline ``deadline_us``
    (``None``: no deadline), asked to stop at ``asked_at_us`` (``None``: not asked).

    SIGTERM ``grace_us`` before the deadline, or when asked, whichever is first; SIGKILL
    ``grace_us`` after the SIGTERM, but never later than the deadline.
    """
    candidates_term = [t for t in (asked_at_us,) if t is not None]
    if deadline_us is not None:
        candidates_term.append(deadline_us - grace_us)
    term_at = min(candidates_term) if candidates_term else None
    if term_at is None:
        return StopPoints(term_at=None, kill_at=None)
    kill_at = term_at + grace_us
    if deadline_us is not None:
        kill_at = min(kill_at, deadline_us)
    return StopPoints(term_at=term_at, kill_at=kill_at)
