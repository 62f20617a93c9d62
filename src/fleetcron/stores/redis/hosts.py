"""The URLs of Redis deployments that name several servers: a Cluster
(``redis+cluster://h1:7000,h2:7000``) and Sentinel
(``redis+sentinel://s1:26379,s2:26379/mymaster``), read into addresses and the checked
keyword arguments of their clients."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from fleetcron.errors import ConfigurationError
from fleetcron.stores.redis.connect import _TLS_PARAMS, _database, _tls_args
from fleetcron.stores.url import StoreURL

__all__ = ["ListedURL", "listed_url"]

_DEFAULT_PORT = {"cluster": 6379, "sentinel": 26379}


@dataclass(frozen=True, slots=True, kw_only=True)
class ListedURL:
    """A multi-server Redis URL: its ``addresses``, the ``service`` Sentinel watches (the
    path's first part; ``""`` for a Cluster), whether it uses TLS, and the keyword
    arguments of each server's connection (timeouts, credentials, database, TLS)."""

    addresses: tuple[tuple[str, int], ...]
    service: str
    tls: bool
    connection: dict[str, Any]


def _address(text: str, kind: str, url: StoreURL) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.partition(":")
    if not host:
        raise ConfigurationError(f"backend URL {url.redacted!r} has an empty host in its list")
    return host, int(port) if port else _DEFAULT_PORT[kind]


def listed_url(url: StoreURL, kind: str) -> ListedURL:
    """Read ``url`` (``kind``: ``cluster`` or ``sentinel``); every parameter is checked and
    named when refused, as for ``redis://`` (:func:`~fleetcron.stores.redis.connect.client_args`).

    Parameters: ``password`` (of the Redis servers; a Cluster's nodes and Sentinel's
    master share it), on Sentinel ``db`` (or the path ``/service/N``) and
    ``sentinel_password`` (of the sentinels themselves), and with ``rediss+…`` the TLS ones.
    """
    parts = urllib.parse.urlsplit(url.driver_url)
    tls = parts.scheme.lower().startswith("rediss")
    query = url.query
    known = ["password"] + (["db", "sentinel_password"] if kind == "sentinel" else [])
    known += list(_TLS_PARAMS) if tls else []
    unknown = sorted(set(query) - set(known))
    if unknown:
        raise ConfigurationError(
            f"backend URL {url.redacted!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join([*known, 'timeout', 'connect_timeout'])}"
        )
    netloc = parts.netloc.rpartition("@")[2]
    addresses = tuple(_address(text, kind, url) for text in netloc.split(","))
    connection: dict[str, Any] = {
        "socket_connect_timeout": url.connect_timeout_s,
        "socket_timeout": url.timeout_s,
        "socket_keepalive": True,
        "health_check_interval": 0,
    }
    if parts.username:
        connection["username"] = urllib.parse.unquote(parts.username)
    password = parts.password or query.get("password")
    if parts.password and "password" in query:
        raise ConfigurationError(
            f"backend URL {url.redacted!r} gives the password twice (before the @ and as "
            "?password=)"
        )
    if password:
        connection["password"] = urllib.parse.unquote(password) if parts.password else password
        connection.setdefault("username", "default")
    path = [part for part in parts.path.split("/") if part]
    service = ""
    if kind == "cluster":
        if path and path != ["0"]:
            raise ConfigurationError(
                f"backend URL {url.redacted!r}: a Redis Cluster has database 0 only; write "
                "redis+cluster://host:port,host:port with no path"
            )
    else:
        if not path:
            raise ConfigurationError(
                f"backend URL {url.redacted!r} names no service: write "
                "redis+sentinel://sentinel:26379,…/<service name>[/<db>]"
            )
        service = urllib.parse.unquote(path[0])
        if len(path) > 2:
            raise ConfigurationError(
                f"backend URL {url.redacted!r}: the path is /<service name>[/<db>]"
            )
        if len(path) == 2 and "db" in query:
            raise ConfigurationError(
                f"backend URL {url.redacted!r} names the database twice (path and ?db=)"
            )
        db = path[1] if len(path) == 2 else query.get("db")
        if db is not None:
            connection["db"] = _database(db, url)
    if tls:
        connection["ssl"] = True
        connection.update(_tls_args(query, url))
    return ListedURL(addresses=addresses, service=service, tls=tls, connection=connection)
