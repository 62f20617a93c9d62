"""From a Redis backend URL to redis-py's client arguments, validated up front.

redis-py turns unknown query parameters into keyword arguments (a ``TypeError`` when the
client is built) and converts known ones without a message (``socket_timeout=abc`` is a
``ValueError``, ``/abc`` a database it cannot parse). Here each parameter is checked and
named in the error instead; the timeouts are the backend URL's ``timeout`` and
``connect_timeout``, the same on every backend.

redis-py's ``socket_connect_timeout`` bounds only the TCP connect: the TLS handshake and
the commands that open the session (``HELLO`` or ``AUTH``, ``CLIENT SETINFO``,
``SELECT``) wait ``socket_timeout`` each, so a server that accepts and stays silent held a
client for the URL's ``timeout``. The connection classes here bound the whole connect by
``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection

from fleetcron.errors import ConfigurationError, StoreRefused
from fleetcron.stores.sql.watchdog import deadline
from fleetcron.stores.url import URL_BOOLEANS, StoreURL

__all__ = [
    "PERSISTENCE_MARKER",
    "async_client",
    "check_password",
    "check_password_async",
    "check_server",
    "client_args",
    "probe",
    "sync_client",
]

log = logging.getLogger("fleetcron")

# Set (NX) by the first client after the server started without data: a Redis that keeps
# nothing loses it with everything else on a restart, so the loud warning comes again
# exactly when the ledger was lost, and once, not on every `fleetcron exec`.
PERSISTENCE_MARKER = "fleetcron:persistence-warned"

_TLS_PARAMS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
_CERT_REQS = ("none", "optional", "required")


def _database(text: str, url: StoreURL) -> int:
    if not text.isdigit() or int(text) > 2**31:
        raise ConfigurationError(
            f"backend URL {url.redacted!r}: the Redis database must be a number "
            f"(redis://host:6379/0), not {text!r}"
        )
    return int(text)


def _tls_args(query: dict[str, str], url: StoreURL) -> dict[str, Any]:
    args: dict[str, Any] = {}
    reqs = query.get("ssl_cert_reqs")
    if reqs is not None:
        if reqs.lower() not in _CERT_REQS:
            raise ConfigurationError(
                f"backend URL {url.redacted!r}: ssl_cert_reqs must be one of "
                f"{', '.join(_CERT_REQS)}, not {reqs!r}"
            )
        args["ssl_cert_reqs"] = reqs.lower()
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path = query.get(key)
        if path is None:
            continue
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigurationError(
                f"backend URL {url.redacted!r}: {key} names {path!r}, not a readable file"
            )
        args[key] = path
    check = query.get("ssl_check_hostname")
    if check is not None:
        if check.lower() not in URL_BOOLEANS:
            raise ConfigurationError(
                f"backend URL {url.redacted!r}: ssl_check_hostname must be true or false, "
                f"not {check!r}"
            )
        args["ssl_check_hostname"] = URL_BOOLEANS[check.lower()]
    return args


def _no_answer(conn: Any) -> redis.exceptions.TimeoutError:
    return redis.exceptions.TimeoutError(
        f"no answer within {conn.socket_connect_timeout:g} s (the backend URL's connect_timeout)"
    )


def _no_reply(conn: Any) -> redis.exceptions.TimeoutError:
    return redis.exceptions.TimeoutError(
        f"no reply within {conn.socket_timeout:g} s while connecting (the backend URL's timeout)"
    )


def _open_socket(conn: Any, opened: Callable[[], Any]) -> Any:
    """``opened()``, the connection class's own ``_connect`` (the TCP or unix connect and,
    on ``rediss://``, the TLS handshake), with ``socket_timeout`` lowered to
    ``connect_timeout`` while it runs: redis-py sets it on the socket once connected, so
    the handshake, and then the session's commands, wait that long at most until
    :func:`_open_session` puts it back. Marks when the whole connect must be done."""
    limit = conn.socket_connect_timeout
    conn.fleetcron_deadline = time.monotonic() + limit
    socket_timeout = conn.socket_timeout
    conn.socket_timeout = limit if socket_timeout is None else min(limit, socket_timeout)
    try:
        return opened()
    except TimeoutError:  # the TCP connect's or the TLS handshake's
        raise _no_answer(conn) from None
    finally:
        conn.socket_timeout = socket_timeout


def _open_session(conn: Any) -> None:
    """redis-py's ``on_connect`` (authentication, ``CLIENT SETINFO``, ``SELECT``) by the
    deadline :func:`_open_socket` marked: the watchdog cuts the socket when it passes, and
    the error names ``connect_timeout``; then the socket waits ``socket_timeout`` again."""
    sock = conn._sock
    # The watchdog gets a descriptor of its own: redis-py closes the socket on an error,
    # and the number it frees could be another socket's when the deadline passes.
    watched = os.dup(sock.fileno())
    cut = deadline(watched, conn.fleetcron_deadline - time.monotonic())
    try:
        with cut:
            conn.on_connect()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        if cut.expired:
            raise _no_answer(conn) from None
        if isinstance(exc, redis.exceptions.TimeoutError):
            # The socket waited min(connect_timeout, timeout) for the reply.
            late = conn.socket_connect_timeout <= (conn.socket_timeout or float("inf"))
            raise (_no_answer(conn) if late else _no_reply(conn)) from None
        raise
    finally:
        os.close(watched)
    if cut.expired:  # cut just as the session opened: the socket is gone
        raise _no_answer(conn)
    conn._sock.settimeout(conn.socket_timeout)


async def _open_socket_async(conn: Any, opened: Callable[[], Awaitable[None]]) -> None:
    """``await opened()``, the connection class's own ``_connect`` (for a unix socket it
    opens the session too), within ``connect_timeout``; marks when the whole connect must
    be done."""
    conn.fleetcron_deadline = asyncio.get_running_loop().time() + conn.socket_connect_timeout
    try:
        async with asyncio.timeout_at(conn.fleetcron_deadline):
            await opened()
    except TimeoutError:
        raise _no_answer(conn) from None


async def _open_session_async(conn: Any) -> None:
    """redis-py's ``on_connect`` by the deadline :func:`_open_socket_async` marked."""
    try:
        async with asyncio.timeout_at(conn.fleetcron_deadline):
            await conn.on_connect()
    except TimeoutError:
        raise _no_answer(conn) from None
    except redis.exceptions.TimeoutError:  # a reply slower than socket_timeout
        raise _no_reply(conn) from None


class _Connection(redis.connection.Connection):
    def _connect(self) -> Any:
        return _open_socket(self, super()._connect)


class _SSLConnection(redis.connection.SSLConnection):
    def _connect(self) -> Any:
        return _open_socket(self, super()._connect)


class _UnixConnection(redis.connection.UnixDomainSocketConnection):
    def _connect(self) -> Any:
        return _open_socket(self, super()._connect)


class _AsyncConnection(redis.asyncio.connection.Connection):
    async def _connect(self) -> None:
        await _open_socket_async(self, super()._connect)


class _AsyncSSLConnection(redis.asyncio.connection.SSLConnection):
    async def _connect(self) -> None:
        await _open_socket_async(self, super()._connect)


class _AsyncUnixConnection(redis.asyncio.connection.UnixDomainSocketConnection):
    async def _connect(self) -> None:
        await _open_socket_async(self, super()._connect)


# Per scheme: the connection class of the sync and of the async client.
_SYNC_CLASSES: dict[str, type[Any]] = {
    "redis": _Connection,
    "rediss": _SSLConnection,
    "unix": _UnixConnection,
}
_ASYNC_CLASSES: dict[str, type[Any]] = {
    "redis": _AsyncConnection,
    "rediss": _AsyncSSLConnection,
    "unix": _AsyncUnixConnection,
}


def _pool_options(args: dict[str, Any], parsed: Mapping[str, object]) -> dict[str, Any]:
    """A pool's arguments as ``ConnectionPool.from_url`` makes them (what the URL says
    wins), less the connection class the URL's scheme names: the caller gives its own
    (``redis.asyncio``'s ``from_url`` would put the scheme's above it)."""
    options: dict[str, Any] = {**args, **parsed}
    options.pop("connection_class", None)
    return options


def sync_client(url: StoreURL) -> redis.Redis:
    """The redis-py client of ``url`` (:func:`client_args`), whose connections are made
    within ``connect_timeout``, session commands included."""
    address, args = client_args(url)
    parsed = redis.connection.parse_url(address)  # type: ignore[no-untyped-call]
    options = _pool_options(args, parsed)
    pool = redis.ConnectionPool(
        connection_class=_SYNC_CLASSES[urllib.parse.urlsplit(address).scheme],
        redis_connect_func=_open_session,
        **options,
    )
    return redis.Redis.from_pool(pool)  # closing the client closes the pool


def async_client(url: StoreURL) -> redis.asyncio.Redis:
    """The ``redis.asyncio`` client of ``url``: :func:`sync_client`'s async twin."""
    address, args = client_args(url)
    options = _pool_options(args, redis.asyncio.connection.parse_url(address))
    pool = redis.asyncio.ConnectionPool(
        connection_class=_ASYNC_CLASSES[urllib.parse.urlsplit(address).scheme],
        redis_connect_func=_open_session_async,
        **options,
    )
    return redis.asyncio.Redis.from_pool(pool)


def client_args(url: StoreURL) -> tuple[str, dict[str, Any]]:
    """``(url, kwargs)`` for ``Redis.from_url``: the URL keeps only the scheme, the
    credentials and the address; everything else is a checked keyword argument
    (:func:`sync_client` and :func:`async_client` build the clients the stores use).

    Parameters: ``db`` (or the path ``/N``), ``password``, and on ``rediss://`` the TLS
    ones (``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_check_hostname``); ``timeout`` and ``connect_timeout`` are read by
    :func:`fleetcron.stores.url.parse_store_url`. A password without a user name is the
    default user's, named (``username="default"``)."""
    parts = urllib.parse.urlsplit(url.driver_url)
    scheme = parts.scheme.lower()
    query = url.query
    known = ["db", "password"] + (list(_TLS_PARAMS) if scheme == "rediss" else [])
    unknown = sorted(set(query) - set(known))
    if unknown:
        hint = " (TLS parameters need rediss://)" if set(unknown) & set(_TLS_PARAMS) else ""
        raise ConfigurationError(
            f"backend URL {url.redacted!r}: unknown parameter(s) {', '.join(unknown)}{hint}; "
            f"known: {', '.join([*known, 'timeout', 'connect_timeout'])}"
        )
    path = parts.path
    args: dict[str, Any] = {
        "socket_connect_timeout": url.connect_timeout_s,
        "socket_timeout": url.timeout_s,
        "health_check_interval": 0,
    }
    if scheme == "unix":
        base = f"{parts.scheme}://{parts.netloc}{path}"
    else:
        # TCP keepalive has no meaning on a unix socket.
        args["socket_keepalive"] = True
        base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        in_path = path.strip("/")
        if in_path and "db" in query:
            raise ConfigurationError(
                f"backend URL {url.redacted!r} names the database twice (path and ?db=)"
            )
        if in_path:
            args["db"] = _database(in_path, url)
    if "db" in query:
        args["db"] = _database(query["db"], url)
    if "password" in query:
        if parts.password is not None:
            # redis-py would take the one before the @ and drop the other without a word.
            raise ConfigurationError(
                f"backend URL {url.redacted!r} gives the password twice (before the @ "
                "and as ?password=)"
            )
        args["password"] = query["password"]
    if (parts.password or query.get("password")) and not parts.username:
        # The default user by name: a server without a password refuses AUTH PASSWORD
        # (RESP2, redis-py's protocol before 8.0) but lets in HELLO 3 AUTH default
        # PASSWORD (RESP3) and AUTH default PASSWORD. One behaviour whatever the protocol,
        # and the store says that the password is not checked (check_password).
        args["username"] = "default"
    args.update(_tls_args(query, url))
    return base, args


def _password_probe(kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """A connection's arguments without its credentials, when they hold a password for the
    default user (no user name, or ``default``); ``None`` otherwise: a named user's
    password picks the user, whether or not the default user needs one."""
    if not kwargs.get("password") or kwargs.get("username") not in (None, "", "default"):
        return None
    return {**kwargs, "username": None, "password": None}


def _warn_unchecked(url: str) -> None:
    log.warning(
        "Redis at %s lets a client in without a password, so the password in the backend "
        "URL is not checked and anyone who reaches the server gets in: set it on the "
        "server (requirepass) or take it out of the URL (see docs/backends.md)",
        url,
        extra={"action": "store_warning", "store": url},
    )


def check_password(url: str, client: redis.Redis) -> None:
    """Warn (``store_warning``) when ``client``'s URL gives a password for the default
    user and the server lets a client in without one: a connection made as the client's
    are, without credentials, is answered ``PONG``. A server that asks for the password
    (``NOAUTH``), or any other failure of that connection, says nothing."""
    pool = client.connection_pool
    kwargs = _password_probe(pool.connection_kwargs)
    if kwargs is None:
        return
    conn: Any = pool.connection_class(**kwargs)
    try:
        conn.connect()
        conn.send_command("PING")
        unchecked = conn.read_response() in (b"PONG", "PONG")
    except redis.exceptions.RedisError:
        unchecked = False
    finally:
        conn.disconnect()
    if unchecked:
        _warn_unchecked(url)


async def check_password_async(url: str, client: redis.asyncio.Redis) -> None:
    """:func:`check_password`'s async twin."""
    pool = client.connection_pool
    kwargs = _password_probe(pool.connection_kwargs)
    if kwargs is None:
        return
    conn: Any = pool.connection_class(**kwargs)
    try:
        await conn.connect()
        await conn.send_command("PING")
        unchecked = await conn.read_response() in (b"PONG", "PONG")
    except redis.exceptions.RedisError:
        unchecked = False
    finally:
        await conn.disconnect()
    if unchecked:
        _warn_unchecked(url)


def probe(pipe: Any, *, mark: bool = True) -> None:
    """Queue on ``pipe`` (sync or async, ``transaction=False``) what
    :func:`check_server` reads: one round trip when the store opens. ``mark=False``: the
    persistence marker is read, not set, so that opening writes nothing."""
    pipe.execute_command("ROLE")
    pipe.config_get("maxmemory-policy")
    pipe.config_get("appendonly")
    pipe.config_get("save")
    if mark:
        pipe.set(PERSISTENCE_MARKER, "1", nx=True)
    else:
        pipe.get(PERSISTENCE_MARKER)


def _config(reply: object, key: str) -> str | None:
    """A ``CONFIG GET`` answer, ``None`` when CONFIG is disabled (managed Redis)."""
    if not isinstance(reply, dict):
        return None
    value = reply.get(key, reply.get(key.encode()))
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


def check_server(url: str, replies: list[Any], *, mark: bool = True) -> None:
    """Refuse a replica; warn about eviction and about a server that keeps nothing.
    ``mark``: as given to :func:`probe`."""
    role_reply, policy, appendonly, save, marker = replies
    # The marker was just set (SET NX answers True), or read and found absent (GET, None):
    # this client is the first since the server lost or never had fleetcron's data.
    first = marker is True if mark else marker is None
    if isinstance(role_reply, Exception):
        raise role_reply
    role = role_reply[0].decode() if isinstance(role_reply[0], bytes) else str(role_reply[0])
    if role not in ("master", "primary"):
        raise StoreRefused(f"{url} is a Redis {role}, not a primary; point at the primary")
    eviction = _config(policy, "maxmemory-policy")
    if eviction and eviction.startswith("allkeys-"):
        log.warning(
            "Redis maxmemory-policy is %s: lease hashes can be evicted under memory "
            "pressure (fences stay monotonic; a lease may be lost early)",
            eviction,
            extra={"action": "store_warning", "store": url},
        )
    aof, rdb = _config(appendonly, "appendonly"), _config(save, "save")
    if aof is None or rdb is None or aof == "yes" or rdb.strip():
        return
    log.log(
        logging.WARNING if first else logging.INFO,
        'Redis at %s keeps nothing across a restart (appendonly no, save ""): a restart '
        "loses every lease and the run ledger, so a slot that already ran can run again; "
        "set appendonly yes (see docs/backends.md)",
        url,
        extra={"action": "store_warning", "store": url},
    )
