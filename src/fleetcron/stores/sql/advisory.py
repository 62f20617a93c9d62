"""PostgreSQL session advisory locks: what lock mode ``advisory`` holds on the server
(:mod:`fleetcron.advisory_lease` holds it on the holder's side; docs/design/leases.md,
"Lock mode advisory").

A holder in this mode holds two things: the session advisory lock of the lock name's key,
on a connection of its own (an :class:`AdvisorySession`), and a lease row like any
holder's, written on that same session once it has the advisory lock
(:meth:`AdvisorySession.acquire`), so that a row is only ever written by a session that
holds the lock at that moment. The server releases the advisory lock the moment the
session ends — the holder's process exited or was killed, its connection was cut or
terminated — so the next advisory contender gets it at once, and takes the row over at
once with a higher fence, without waiting for the row to expire. The advisory lock gives
mutual exclusion among advisory holders; the row gives the fence, the expiry a plain
holder respects, and what ``fleetcron locks`` shows.

- :func:`advisory_key` — a name's key: 64 bits of a keyed BLAKE2b of namespace and name.
  Two names whose keys collide only exclude each other (one waits while the other holds);
  one name always has one key, so a collision never lets two holders of one name in.
- :func:`mark_advisory` — the mark an advisory holder leaves in the row (its token, after
  the last colon of ``host:pid:token``, starts with ``advisory.``:
  :func:`~fleetcron.models.is_advisory_holder`): only such a row is taken over before it
  expires.
- :func:`advisory_held` — the monitoring read: the advisory locks held now, with their
  sessions (``pg_locks`` joined with ``pg_stat_activity``).

A holder frozen past its lease's expiry (stopped, paused) keeps its session, which its
kernel keeps up: the next contender ends that session (``advisory_end_stale``) so that
``lock_at_most`` stays the ceiling. A row written before the server started, or on an
earlier timeline, is not taken over early: a restart or a failover drops the advisory
locks before their holders can know it.

Behind a pooler in transaction pooling (PgBouncer ``pool_mode = transaction``) a session
lock stays on a server connection other clients share: the session refuses it, with the
test ``fleetcron doctor`` makes (:mod:`fleetcron.stores.sql.pooling`).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.pq import ConnStatus

from fleetcron._log import log
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.models import ADVISORY_TOKEN, AdvisoryHold, LeaseRecord
from fleetcron.stores.base import Operation, acquired_record, connect_error
from fleetcron.stores.sql.files import load_queries
from fleetcron.stores.sql.postgres import connect_kwargs, translate
from fleetcron.stores.sql.runner import timed_out
from fleetcron.stores.sql.statements import Query, SqlResult
from fleetcron.stores.sql.watchdog import deadline
from fleetcron.stores.url import StoreURL

__all__ = [
    "AdvisorySession",
    "PostgresAdvisoryLocks",
    "advisory_held",
    "advisory_key",
    "mark_advisory",
    "session_name",
]

_APPLICATION_NAME_BYTES = 63  # PostgreSQL keeps NAMEDATALEN - 1 bytes of it
_PROBES = 3  # interleaved statements of the pooling test, as fleetcron doctor's
# How long a contender that ended a stale holder's session waits for its lock to be free
# (the server process exits on its own time), trying every _STALE_POLL_S.
_STALE_WAIT_S = 2.0
_STALE_POLL_S = 0.02


def advisory_key(namespace: str, name: str) -> int:
    """The advisory lock key of ``name`` in ``namespace``: a signed 64-bit integer, the
    same in every process and version."""
    text = f"{len(namespace)}:{namespace}:{name}".encode()
    digest = hashlib.blake2b(text, digest_size=8, person=b"fleetcron").digest()
    return int.from_bytes(digest, "big", signed=True)


def mark_advisory(holder: str) -> str:
    """``holder`` (``host:pid:token``) with the advisory mark on its token."""
    head, _, token = holder.rpartition(":")
    return f"{head}:{ADVISORY_TOKEN}{token}"


def session_name(namespace: str, name: str) -> str:
    """The ``application_name`` of the session that holds ``name``'s advisory lock (cut
    to the 63 bytes PostgreSQL keeps), for whoever reads ``pg_stat_activity``."""
    text = f"fleetcron advisory {namespace}/{name}".encode()
    return text[:_APPLICATION_NAME_BYTES].decode("utf-8", "ignore")


@functools.cache
def _queries() -> dict[str, str]:
    return load_queries("postgres")


def advisory_held(namespace: str, names: Sequence[str]) -> Operation[list[AdvisoryHold]]:
    """The advisory locks of ``names`` held now in this database, by session (a lock of
    another application whose key is one of theirs shows too: it excludes them as well)."""
    keys = {advisory_key(namespace, name): name for name in names}
    if not keys:
        return []
    result: SqlResult = yield Query("advisory_held", {"keys": list(keys)})
    holds = []
    for row in result.rows:
        value: Mapping[str, Any] = dict(zip(result.columns, row, strict=True))
        holds.append(
            AdvisoryHold(
                name=keys[int(value["key"])],
                key=int(value["key"]),
                pid=int(value["pid"]),
                client_addr=value["client_addr"],
                application_name=value["application_name"],
                backend_start_us=value["backend_start_us"],
                held_since_us=value["held_since_us"],
                now_us=int(value["now_us"]),
            )
        )
    return sorted(holds, key=lambda hold: (hold.name, hold.pid))


class AdvisorySession:
    """A connection of the holder's own that holds one session advisory lock: open it
    with :meth:`open`, write the lease row with :meth:`acquire`, watch :attr:`fd` and ask
    :meth:`ended` when it is readable, and :meth:`close` it to give the lock back. Nothing
    else is sent on it while it holds the lock: the row is renewed through the store."""

    def __init__(self, conn: psycopg.Connection[Any], url: StoreURL, key: int, pid: int) -> None:
        self._conn = conn
        self._url = url
        self.key = key
        """The advisory lock's key (:func:`advisory_key`)."""
        self.pid = pid
        """The server process that holds the lock (``pg_backend_pid()``)."""
        self.fd: int = conn.pgconn.socket
        """The session's socket: readable when the server says something, or closes it."""

    @classmethod
    def open(cls, url: StoreURL, namespace: str, name: str) -> AdvisorySession | None:
        """Connect and try the lock of ``name`` without waiting: the session holding it,
        or ``None`` when another session holds it. :class:`ConfigurationError` behind a
        pooler in transaction pooling; a :class:`StoreError` when the server cannot be
        reached or refuses."""
        key = advisory_key(namespace, name)
        application_name = session_name(namespace, name)
        options = {
            **connect_kwargs(url),
            "application_name": application_name,
            "prepare_threshold": None,
        }
        try:
            conn = psycopg.connect(url.driver_url, **options)
        except psycopg.Error as exc:
            raise connect_error(url.redacted, translate(exc)) from exc
        try:
            (pid,) = _one(conn, url, "advisory_session_pid", {})
            if pid != conn.info.backend_pid:
                # A pooler announced a process of its own at connect: which kind?
                _refuse_transaction_pooling(conn, url, pid)
            got, locked_in, *_ = _one(conn, url, "advisory_try_lock", {"key": key})
            if locked_in != pid:  # moved to another server connection: pooled per transaction
                raise _pooled(url)
            if not got:
                stale = {
                    "namespace": namespace,
                    "name": name,
                    "key": key,
                    "application_name": application_name,
                }
                got = _end_stale_holder(conn, url, stale)
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return None
        return cls(conn, url, key, int(pid))

    def acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> LeaseRecord | None:
        """Write the lease row of the name whose lock this session holds: taken when free
        or expired, or held by another advisory holder past its ``min_until`` (rules in
        ``lease_acquire_advisory``); ``None`` when a plain holder's lease (or another
        advisory holder's ``lock_at_least``) still holds it. ``holder`` carries the mark
        (:func:`mark_advisory`). Sent on this session: were it gone, the write fails
        instead of overwriting the row of a holder that has the lock since."""
        params = {
            "namespace": namespace,
            "name": name,
            "holder": holder,
            "ttl_us": ttl_us,
            "least_us": least_us,
        }
        rows = _rows(self._conn, self._url, "lease_acquire_advisory", params)
        if not rows:
            return None
        fence, now_us = rows[0]
        return acquired_record(namespace, name, holder, int(fence), int(now_us), ttl_us, least_us)

    def ended(self) -> str | None:
        """Read what the server sent the idle session: ``None`` while the session is
        alive, else why it ended. A notice (a warning, a parameter report) is read and
        dropped; a termination is read as the server's farewell, then the end of the
        connection."""
        pgconn = self._conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as exc:
            return _first_line(exc)
        if pgconn.status != ConnStatus.OK:
            return "the connection is broken"
        while pgconn.notifies() is not None:
            pass
        return None

    def close(self) -> None:
        """Give the lock back and close the session (idempotent). The unlock is sent
        before closing: a pooler in session pooling returns the server connection to its
        pool, and may have been told not to reset it."""
        conn = self._conn
        if conn.closed:
            return
        try:
            if conn.pgconn.status == ConnStatus.OK:
                _one(conn, self._url, "advisory_unlock", {"key": self.key})
        except StoreError:
            pass  # closing the session releases the lock as well
        finally:
            conn.close()


def _rows(
    conn: psycopg.Connection[Any], url: StoreURL, name: str, params: Mapping[str, object]
) -> list[tuple[Any, ...]]:
    """The rows of query ``name`` on ``conn``, within the URL's read timeout; driver
    errors translated."""
    limit = deadline(conn.pgconn.socket, url.timeout_s)
    try:
        with limit:
            rows = conn.execute(_queries()[name], params, prepare=False).fetchall()
    except psycopg.Error as exc:
        if limit.expired:
            raise timed_out(url) from exc
        error = translate(exc)
        raise (error or StoreError(_first_line(exc))) from exc
    return [tuple(row) for row in rows]


def _one(
    conn: psycopg.Connection[Any], url: StoreURL, name: str, params: Mapping[str, object]
) -> tuple[Any, ...]:
    """The one row of query ``name`` on ``conn`` (:func:`_rows`)."""
    rows = _rows(conn, url, name, params)
    if not rows:
        raise StoreError(f"the store answered {name} with no row")
    return rows[0]


def _end_stale_holder(
    conn: psycopg.Connection[Any], url: StoreURL, stale: Mapping[str, object]
) -> bool:
    """The lock being busy: end the session of a holder whose lease has expired (the
    rules are in ``advisory_end_stale``), then wait a moment for its lock. Whether this
    session has the lock now."""
    name = stale["name"]
    try:
        (ended,) = _one(conn, url, "advisory_end_stale", stale)
    except StoreError as exc:  # this role may not signal that session: it stays busy
        log.warning(
            "the advisory lock of %s is held by a session whose lease has expired, and "
            "ending it failed: %s",
            name,
            exc.message,
            extra={"action": "advisory_stale_failed", "lock": name},
        )
        return False
    if not ended:
        return False
    log.warning(
        "ended the session of %s's advisory holder: its lease had expired while its "
        "session held the lock (the holder is frozen or hung)",
        name,
        extra={"action": "advisory_stale_ended", "lock": name},
    )
    give_up = time.monotonic() + _STALE_WAIT_S
    while True:
        got, *_ = _one(conn, url, "advisory_try_lock", {"key": stale["key"]})
        if got or time.monotonic() >= give_up:
            return bool(got)
        time.sleep(_STALE_POLL_S)


def _refuse_transaction_pooling(conn: psycopg.Connection[Any], url: StoreURL, pid: int) -> None:
    """Judge the pooler before the session like ``fleetcron doctor`` does: the session's
    statements interleaved with those of a second connection. Pooled per transaction
    (server connections shared, or the session moved): :class:`ConfigurationError`."""
    from fleetcron.stores.sql.pooling import PoolingFacts, pooling_mode

    options = {**connect_kwargs(url), "prepare_threshold": None}
    try:
        other = psycopg.connect(url.driver_url, **options)
    except psycopg.Error as exc:
        raise connect_error(url.redacted, translate(exc)) from exc
    first, second = [(conn.info.backend_pid, pid)], []
    try:
        for index in range(_PROBES):
            second.append(_pids(other, url))
            if index < _PROBES - 1:
                first.append(_pids(conn, url))
    finally:
        other.close()
    facts = PoolingFacts(first=tuple(first), second=tuple(second))
    if pooling_mode(facts) == "transaction":
        raise _pooled(url)


def _pids(conn: psycopg.Connection[Any], url: StoreURL) -> tuple[int, int]:
    """The server process ``conn`` announced at connect, and the one its statement ran in."""
    return conn.info.backend_pid, int(_one(conn, url, "advisory_session_pid", {})[0])


def _pooled(url: StoreURL) -> ConfigurationError:
    return ConfigurationError(
        f"lock mode 'advisory' cannot work through {url.redacted}: a pooler there pools "
        "per transaction (PgBouncer pool_mode = transaction or statement; fleetcron doctor "
        "shows it), so a session advisory lock would stay on a server connection other "
        "clients share. Where advisory locks are taken, use a backend URL that reaches "
        "PostgreSQL directly or through session pooling, or use lock mode 'lease', which "
        "works behind it"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostgresAdvisoryLocks:
    """The session advisory locks of one PostgreSQL server
    (:class:`~fleetcron.stores.advisory_api.AdvisoryLocks`)."""

    def __init__(self, url: StoreURL) -> None:
        self._url = url

    def open(self, namespace: str, name: str) -> AdvisorySession | None:
        return AdvisorySession.open(self._url, namespace, name)

    def held(self, namespace: str, names: Sequence[str]) -> Operation[list[AdvisoryHold]]:
        return advisory_held(namespace, names)

    def mark(self, holder: str) -> str:
        return mark_advisory(holder)
