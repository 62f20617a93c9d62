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


def _split_userinfo(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo, rest)`` of a URL with credentials, found without a URL
    parser: the userinfo runs to the *last* ``@`` of the authority, so a password holding
    ``/``, ``#``, ``?`` or ``@`` (which a parser would split elsewhere) is still found.
    ``None`` when the URL has no ``@`` after its scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    # A password may hold '/', '?', '#' or '@' where a host may not: whatever comes before
    # the last '@' is taken for the credentials, so it is never printed.
    at = rest.rfind("@")
    if at < 0:
        return None
    return scheme + sep, rest[:at], rest[at:]


def redact(url: str) -> str:
    """Replace the password of a URL (and ``password=`` query values) with ``***``.

    Done on the text itself before any parsing, so that a URL a parser would misread (a
    password with ``/``, ``#``, ``?`` or ``@`` not percent-encoded) never shows its secret.
    """
    split = _split_userinfo(url)
    if split is not None:
        head, userinfo, rest = split
        user, sep, _password = userinfo.partition(":")
        url = f"{head}{user}{':***' if sep else ''}{rest}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if "password" not in parts.query.lower():
        return url
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    masked = [(k, "***" if "password" in k.lower() else v) for k, v in query]
    return urllib.parse.urlunsplit(
        (
            parts.scheme,
            parts.netloc,
            parts.path,
            urllib.parse.urlencode(masked, safe="*"),
            parts.fragment,
        )
    )


def _check_userinfo(url: str, redacted: str) -> None:
    """Refuse credentials a URL parser would split wrongly (and a driver then print)."""
    split = _split_userinfo(url)
    if split is None:
        return
    userinfo = split[1]
    unsafe = sorted({c for c in userinfo if c in "/?#@"})
    if unsafe:
        listed = " ".join(repr(c) for c in unsafe)
        raise ConfigurationError(
            f"backend URL {redacted!r}: the user or password holds {listed}, which must be "
            "percent-encoded (/ is %2F, ? is %3F, # is %23, @ is %40); an '@' in the path "
            "or the query is written %40 too"
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
    if kind not in ("memory", "sqlite") and scheme.lower() != "unix":
        _check_userinfo(url, redacted)  # a file path may hold '@' and '/'
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
