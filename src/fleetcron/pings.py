"""Pings: each attempt reported to a monitoring URL, in healthchecks.io's convention.

A job with a ``ping_url`` (jobs file, ``@fleet.job``) or a ``fleetcron exec --ping-url``
tells that URL when each attempt starts and how it ended, with the ledger's run id as
``rid`` so the monitor pairs the two and measures the run's duration:

===============================================  =========================================
when                                             request
===============================================  =========================================
the attempt starts                               ``GET <ping_url>/start?rid=<run id>``
it succeeded                                     ``GET <ping_url>?rid=<run id>``
a command exited by itself with status N ≠ 0     ``POST <ping_url>/N?rid=<run id>``
any other failure: timed out, cancelled, lease   ``POST <ping_url>/fail?rid=<run id>``
lost, a ``call`` raised
it failed and will be retried (``retries``)      ``POST <ping_url>/log?rid=<run id>``
===============================================  =========================================

A ``POST`` carries the end of the run's output and error as ``text/plain`` (at most
:data:`BODY_LIMIT` bytes): text the executor already scrubbed of the store's password,
never more than the ledger keeps. A query the URL carries (``?create=1``) is kept.

Pings never delay or fail a run. They go out in the background — :class:`AsyncPinger` (the
daemon) or :class:`Pinger` (``exec``) — in order per run (a finish never overtakes its
start), each with :data:`TIMEOUT_S` per try and up to :data:`TRIES` tries with a doubling
back-off. A ping that fails for good is logged once (WARNING, ``ping_failed``); one sent
is logged at DEBUG (``ping_sent``). When the pinger closes, pending pings get
``wait_s`` to go out and are then dropped (WARNING, ``ping_dropped``).

The secret of a ping URL is its path (healthchecks: the check's UUID, or the project's
ping key then the slug; Cronitor: the API key): logs and error messages show
:func:`redact`'s ``scheme://host/***`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fleetcron._log import log
from fleetcron._version import __version__
from fleetcron.errors import ConfigurationError
from fleetcron.models import RunOutcome

__all__ = [
    "BODY_LIMIT",
    "CLOSE_WAIT_S",
    "TIMEOUT_S",
    "TRIES",
    "AsyncPinger",
    "Ping",
    "PingPolicy",
    "Pinger",
    "check_ping_url",
    "deliver",
    "finish_ping",
    "redact",
    "start_ping",
]

TIMEOUT_S = 10.0
"""Seconds each try may take to connect, and then to read (urllib's socket timeout)."""
TRIES = 3
BACKOFF_S = 1.0
"""The wait before the second try; doubled before each further one."""
BODY_LIMIT = 10_000
"""Bytes of output and error sent with a failure (healthchecks keeps up to 100 KB)."""
CLOSE_WAIT_S = 5.0
"""How long pending pings may still take when the pinger closes (exit, shutdown)."""
PENDING_LIMIT = 1_000
"""Pings an :class:`AsyncPinger` holds at most; more are dropped (an endpoint that has
been failing for a long while must not grow the replica's memory)."""
CONCURRENCY = 8
"""Requests an :class:`AsyncPinger` has in flight at most (one thread each)."""

_MASK = "***"
_RETRIED_HTTP = frozenset({408, 429})  # and every 5xx


def redact(url: str) -> str:
    """``url`` as it may be logged: its scheme and host (and port) only, e.g.
    ``https://hc-ping.com/***``. Credentials, path and query are the secret."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return _MASK
    if not parts.scheme:
        return _MASK
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}/{_MASK}"


def check_ping_url(value: str) -> str:
    """``value`` if it can be pinged: an ``http(s)`` URL with a host, no whitespace or
    other control characters, ASCII only (percent-encode the rest). Else a
    :class:`ConfigurationError` whose message shows the URL redacted."""
    for index, char in enumerate(value):
        if char.isspace() or not char.isprintable():
            raise ConfigurationError(
                f"{redact(value)!r} holds whitespace or a control character "
                f"(at character {index + 1}); percent-encode it"
            )
        if not char.isascii():
            raise ConfigurationError(
                f"{redact(value)!r} holds a non-ASCII character (at character {index + 1}); "
                "percent-encode it"
            )
    try:
        parts = urllib.parse.urlsplit(value)
        _ = parts.port  # an invalid port is refused here, not at the first ping
    except ValueError as exc:
        raise ConfigurationError(f"{redact(value)!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigurationError(f"{redact(value)!r} is not an http(s) URL")
    if not parts.hostname:
        raise ConfigurationError(f"{redact(value)!r} has no host")
    if "@" in parts.netloc:
        # urllib would take "user:password@host" for the host name: every ping would fail.
        raise ConfigurationError(
            f"{redact(value)!r}: a user name or password in a ping URL is not supported"
        )
    return value


@dataclass(frozen=True, slots=True)
class Ping:
    """One request to a ping URL. ``body`` ``None``: a GET; else a POST carrying it."""

    job: str
    run_id: str
    kind: str
    """What it reports, for the logs: ``start``, ``success``, ``fail``, ``log`` or
    ``exit status N``."""
    url: str = field(repr=False)
    body: bytes | None = field(default=None, repr=False)
    content_type: str = "text/plain; charset=utf-8"

    @property
    def method(self) -> str:
        # GET when there is nothing to send but the signal: it is what healthchecks' own
        # examples use and what every compatible monitor accepts (HEAD is not accepted
        # everywhere, and its answer carries no text to report). POST when the output
        # and error go along, as the request's body.
        return "GET" if self.body is None else "POST"

    @property
    def redacted(self) -> str:
        return redact(self.url)


@dataclass(frozen=True, slots=True, kw_only=True)
class PingPolicy:
    """How hard a ping is tried: ``tries`` of ``timeout_s`` each, ``backoff_s`` before the
    second, doubled before each further one."""

    timeout_s: float = TIMEOUT_S
    tries: int = TRIES
    backoff_s: float = BACKOFF_S


def _url(ping_url: str, suffix: str, run_id: str) -> str:
    parts = urllib.parse.urlsplit(ping_url)
    path = parts.path.rstrip("/") + (f"/{suffix}" if suffix else "")
    rid = urllib.parse.urlencode({"rid": run_id})
    query = f"{parts.query}&{rid}" if parts.query else rid
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def start_ping(job: str, ping_url: str, run_id: str) -> Ping:
    """The ping of an attempt's start: ``<ping_url>/start?rid=<run_id>``."""
    return Ping(job, run_id, "start", _url(ping_url, "start", run_id))


def finish_ping(
    job: str,
    ping_url: str,
    run_id: str,
    outcome: RunOutcome,
    *,
    exit_status: int | None,
    retrying: bool = False,
) -> Ping:
    """The ping of an attempt's end. ``exit_status``: the status a command exited with by
    itself (``None`` for a function, or a command fleetcron stopped: those failures are
    ``/fail``). ``retrying``: the failed attempt will be tried again, so it is only logged
    (``/log``) and the monitor's state follows the last attempt."""
    if outcome.state == "succeeded":
        return Ping(job, run_id, "success", _url(ping_url, "", run_id))
    if retrying:
        kind = suffix = "log"
    elif exit_status is not None and exit_status != 0:
        kind, suffix = f"exit status {exit_status}", str(exit_status)
    else:
        kind = suffix = "fail"
    return Ping(job, run_id, kind, _url(ping_url, suffix, run_id), _body(outcome))


def _body(outcome: RunOutcome) -> bytes:
    """The end of the output, then the error (or the state), at most BODY_LIMIT bytes."""
    parts = [text for text in (outcome.output, outcome.error or outcome.state) if text]
    text = "\n".join(part.rstrip("\n") for part in parts) + "\n"
    data = text.encode("utf-8", "replace")
    if len(data) > BODY_LIMIT:
        # Keep the end; a character cut in two at the start is dropped.
        data = data[-BODY_LIMIT:].decode("utf-8", "ignore").encode()
    return data


# -- sending ----------------------------------------------------------------------------


class _Retry(Exception):
    """A try failed in a way another try may not."""


def _user_agent() -> str:

    return f"fleetcron/{__version__}"


def _mask(text: str, url: str) -> str:
    """``text`` (an error's) with the URL and its secret part masked, should it hold them."""
    parts = urllib.parse.urlsplit(url)
    for secret in (url, parts.path, parts.query, parts.netloc.rpartition("@")[0]):
        if len(secret) > 1:
            text = text.replace(secret, _MASK)
    return text


def _try(ping: Ping, timeout_s: float) -> int:
    """Send ``ping`` once; its HTTP status, or an exception (``_Retry`` when worth again)."""
    headers = {"User-Agent": _user_agent()}
    if ping.body is not None:
        headers["Content-Type"] = ping.content_type
    request = urllib.request.Request(ping.url, data=ping.body, headers=headers, method=ping.method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read(1024)  # healthchecks answers "OK"; more is not wanted
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        problem = f"HTTP {exc.code}"
        if exc.code >= 500 or exc.code in _RETRIED_HTTP:
            raise _Retry(problem) from None
        raise ValueError(problem) from None
    except TimeoutError:
        raise _Retry(f"no answer within {timeout_s:g}s") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise _Retry(f"no answer within {timeout_s:g}s") from None
        raise _Retry(_mask(str(reason), ping.url)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Retry(_mask(f"{type(exc).__name__}: {exc}", ping.url)) from None


def deliver(ping: Ping, policy: PingPolicy, stop: threading.Event | None = None) -> bool:
    """Send ``ping`` (blocking), trying again after a failure that another try may not
    meet; log the result. Whether it was delivered. ``stop``: once set, give up silently
    (the pinger closed and reports the ping as dropped)."""
    stop = stop or threading.Event()
    delay = policy.backoff_s
    problem = ""
    tries = 0
    while tries < policy.tries and not stop.is_set():
        tries += 1
        try:
            status = _try(ping, policy.timeout_s)
        except _Retry as exc:
            problem = str(exc)
        except Exception as exc:  # refused for good (HTTP 4xx), or not sendable at all
            problem = _mask(str(exc) or type(exc).__name__, ping.url)
            break
        else:
            log.debug(
                "%s: ping %s sent to %s (HTTP %d)",
                ping.job,
                ping.kind,
                ping.redacted,
                status,
                extra={"action": "ping_sent", "job": ping.job, "run_id": ping.run_id},
            )
            return True
        if tries < policy.tries and stop.wait(delay):
            break
        delay *= 2
    if stop.is_set():
        return False
    log.warning(
        "%s: ping %s to %s failed after %d %s (%s); the run is not affected",
        ping.job,
        ping.kind,
        ping.redacted,
        tries,
        "try" if tries == 1 else "tries",
        problem,
        extra={"action": "ping_failed", "job": ping.job, "run_id": ping.run_id},
    )
    return False


def _log_dropped(pings: Iterable[Ping], why: str) -> None:
    """One WARNING per job and URL for the pings that will not be sent."""
    counts = Counter((ping.job, ping.redacted) for ping in pings)
    for (job, where), count in counts.items():
        log.warning(
            "%s: %d ping(s) to %s dropped: %s",
            job,
            count,
            where,
            why,
            extra={"action": "ping_dropped", "job": job},
        )


class Pinger:
    """Sends pings one after another from a background (daemon) thread, for a process
    that runs one attempt (``fleetcron exec``). :meth:`send` never blocks; :meth:`close`
    gives what is pending up to ``wait_s`` and drops the rest."""

    def __init__(self, policy: PingPolicy | None = None) -> None:
        self._policy = policy or PingPolicy()
        self._queue: deque[Ping] = deque()
        self._busy: Ping | None = None
        self._closing = False
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, ping: Ping) -> None:
        """Queue ``ping``; it goes out after every ping queued before it."""
        with self._changed:
            if self._closing:
                _log_dropped([ping], "the pinger is closed")
                return
            self._queue.append(ping)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="fleetcron-ping", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                ping = self._busy = self._queue.popleft()
            try:
                deliver(ping, self._policy, self._stop)
            finally:
                with self._changed:
                    self._busy = None
                    self._changed.notify_all()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Wait up to ``wait_s`` for the pending pings to go out; drop the rest (logged)."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            if self._changed.wait_for(lambda: not self._queue and self._busy is None, wait_s):
                return
            dropped = [*([self._busy] if self._busy else []), *self._queue]
            self._queue.clear()
            self._stop.set()
        _log_dropped(dropped, f"not sent within {wait_s:g}s of the end")


async def _in_thread(work: Callable[[], object]) -> None:
    """Run ``work`` in a daemon thread of its own and wait for it.

    Not ``asyncio.to_thread``: the loop's default executor runs the store's operations
    (SQLite, sync drivers), so pings stuck on a silent endpoint would queue them — and
    delay runs; and ``asyncio.run`` waits for that executor's threads at exit, so one
    would hold the shutdown for all its tries. A daemon thread holds neither.
    """
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not finished.done():
            finished.set_result(None)

    def target() -> None:
        try:
            work()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle)

    threading.Thread(target=target, name="fleetcron-ping", daemon=True).start()
    await finished


class AsyncPinger:
    """Sends pings in the background of an event loop (the scheduler daemon): each in a
    thread of its own, at most :data:`CONCURRENCY` at once, in order per run id (a ping
    waits for the one queued before it for the same run). :meth:`send` never blocks and
    never raises; :meth:`close` gives what is pending up to ``wait_s`` and drops the rest."""

    def __init__(
        self,
        policy: PingPolicy | None = None,
        *,
        limit: int = PENDING_LIMIT,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self._policy = policy or PingPolicy()
        self._limit = limit
        self._slots = asyncio.Semaphore(concurrency)
        self._pending: dict[asyncio.Task[None], Ping] = {}
        self._last: dict[str, asyncio.Task[None]] = {}  # per run id: the last ping queued
        self._stop = threading.Event()
        self._closed = False

    @property
    def pending(self) -> int:
        """Pings queued or in flight."""
        return len(self._pending)

    def send(self, ping: Ping) -> None:
        """Queue ``ping`` (from the loop's thread)."""
        if self._closed:
            _log_dropped([ping], "the pinger is closed")
            return
        if len(self._pending) >= self._limit:
            _log_dropped([ping], f"{len(self._pending)} pings are already waiting")
            return
        previous = self._last.get(ping.run_id)
        task = asyncio.get_running_loop().create_task(
            self._deliver(ping, previous), name=f"fleetcron-ping:{ping.job}"
        )
        self._pending[task] = ping
        self._last[ping.run_id] = task
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        ping = self._pending.pop(task)
        if self._last.get(ping.run_id) is task:
            del self._last[ping.run_id]

    async def _deliver(self, ping: Ping, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        async with self._slots:
            await _in_thread(lambda: deliver(ping, self._policy, self._stop))

    async def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Wait up to ``wait_s`` for the pending pings to go out; drop the rest (logged)."""
        self._closed = True
        if not self._pending:
            return
        _, left = await asyncio.wait(list(self._pending), timeout=wait_s)
        if not left:
            return
        self._stop.set()
        dropped = [self._pending[task] for task in left if task in self._pending]
        for task in left:
            task.cancel()
        await asyncio.wait(left)  # they only wait on the loop: cancelled at once
        _log_dropped(dropped, f"not sent within {wait_s:g}s of the shutdown")
