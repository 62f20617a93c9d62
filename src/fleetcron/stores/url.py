"""Backend URLs: parsing, validation, redaction and the default location."""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from fleetcron.errors import ConfigurationError

__all__ = ["SCHEMES", "StoreURL", "default_sqlite_path", "parse_store_url", "redact"]

SCHEMES = {
    "memory": "memory",
    "sqlite": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
}


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed backend URL. ``raw`` keeps credentials; ``redacted`` is safe to print."""

    raw: str
    kind: str
    redacted: str
    path: Path | None = None  # SQLite only


def redact(url: str) -> str:
    """Replace the password of a URL (and ``password=`` query values) with ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" not in netloc and "password" not in parts.query.lower():
        return url
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        netloc = f"{user}{':***' if sep else ''}@{hostport}"
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    masked = [(k, "***" if "password" in k.lower() else v) for k, v in query]
    return urllib.parse.urlunsplit(
        (parts.scheme, netloc, parts.path, urllib.parse.urlencode(masked, safe="*"), parts.fragment)
    )


def default_sqlite_path() -> Path:
    """``$XDG_STATE_HOME/fleetcron/fleetcron.db`` (``~/.local/state/…`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "fleetcron" / "fleetcron.db"


def parse_store_url(url: str) -> StoreURL:
    """Validate ``url`` and say which backend it names. Nothing is opened here."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("backend URL is empty")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"backend URL {redact(url)!r} has no scheme; use one of "
            "sqlite:///path, postgresql://…, mysql://…, redis://…, memory://"
        )
    kind = SCHEMES.get(scheme.lower())
    if kind is None:
        known = ", ".join(sorted({f"{s}://" for s in SCHEMES}))
        raise ConfigurationError(f"backend URL scheme {scheme!r} is not supported (known: {known})")
    redacted = redact(url)
    if kind == "memory":
        return StoreURL(raw=url, kind=kind, redacted=redacted)
    if kind == "sqlite":
        path_text = urllib.parse.unquote(rest.split("?", 1)[0])
        if not path_text or path_text == "/":
            raise ConfigurationError(f"backend URL {redacted!r} names no database file")
        if "\x00" in path_text:
            raise ConfigurationError(f"backend URL {redacted!r}: the path contains a NUL byte")
        return StoreURL(raw=url, kind=kind, redacted=redacted, path=Path(path_text))
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # validates the port
    except ValueError as exc:
        raise ConfigurationError(f"backend URL {redacted!r} is invalid: {exc}") from None
    if kind != "redis" or scheme.lower() != "unix":
        if not parts.hostname and "host=" not in parts.query:
            raise ConfigurationError(f"backend URL {redacted!r} names no host")
    return StoreURL(raw=url, kind=kind, redacted=redacted)
