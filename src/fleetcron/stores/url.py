"""Backend URLs: parsing, validation, redaction and the default location."""

from __future__ import annotations

import os
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fleetcron.durations import parse_duration
from fleetcron.errors import ConfigurationError
from fleetcron.stores.backends import schemes

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "LISTED_KINDS",
    "SCHEMES",
    "URL_BOOLEANS",
    "StoreURL",
    "default_sqlite_path",
    "parse_store_url",
    "redact",
    "sqlite_url",
    "url_passwords",
]

LISTED_KINDS = ("postgres", "redis-cluster", "redis-sentinel", "etcd")
"""The backends whose URL may name several servers (``h1:p1,h2:p2``)."""

SCHEMES = schemes()
"""Every URL scheme, and the kind of backend it names (:mod:`fleetcron.stores.backends`)."""


# Seconds. One pair of limits, the same on every backend, settable in any backend URL
# (``?connect_timeout=5&timeout=10``): a server that accepts a connection and never
# answers must not hang a client. On SQLite ``timeout`` is how long a writer waits for
# the database lock (there is no connection to make).
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 30.0
_TIMEOUT_PARAMS = ("timeout", "connect_timeout")
_MAX_TIMEOUT_S = 31_536_000  # a year: PyMySQL's own limit, and within every socket's


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed backend URL. ``raw`` keeps credentials; ``redacted`` is safe to print;
    ``driver`` is ``raw`` without the parameters fleetcron itself reads (the timeouts and,
    on PostgreSQL, ``prepared_statements``)."""

    raw: str
    kind: str
    redacted: str
    path: Path | None = None  # SQLite only
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    driver: str = ""
    prepared_statements: bool = True  # PostgreSQL only

    @property
    def driver_url(self) -> str:
        """The URL handed to the driver."""
        return self.driver or self.raw

    @property
    def shown(self) -> str:
        """``redacted``, and for a SQLite path relative to the working directory the
        absolute path it names from here: what a start-up line prints."""
        if self.path is None or self.path.is_absolute() or str(self.path).startswith("~"):
            return self.redacted
        try:
            return f"{self.redacted} ({Path.cwd() / self.path})"
        except OSError:  # a deleted working directory
            return self.redacted

    @property
    def query(self) -> dict[str, str]:
        """The driver URL's query parameters (none is repeated: :func:`parse_store_url`
        refuses that)."""
        query = self.driver_url.partition("?")[2]
        return dict(urllib.parse.parse_qsl(query, keep_blank_values=True))


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


def url_passwords(url: str) -> list[str]:
    """The passwords ``url`` carries, as written: its userinfo password and each
    ``password=`` query value (found as :func:`redact` finds them). A file or memory URL
    carries none."""
    scheme = url.partition("://")[0].lower()
    if SCHEMES.get(scheme) in ("memory", "sqlite"):
        return []
    found: list[str] = []
    split = _split_userinfo(url)
    if split is not None:
        _user, sep, password = split[1].partition(":")
        if sep and password:
            found.append(password)
    query = (url if split is None else split[2]).partition("?")[2].partition("#")[0]
    for pair in query.split("&"):
        key, sep, value = pair.partition("=")
        if sep and value and "password" in urllib.parse.unquote_plus(key).lower():
            found.append(value)
    return found


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


def _foreign_digits(text: str) -> bool:
    """Whether ``text`` holds a digit that is not ASCII (``١``, ``１``, ``²``)."""
    return any(c.isdigit() and not c.isascii() for c in text)


def _seconds(text: str, key: str, redacted: str) -> float:
    """A timeout: a number of seconds (as libpq, PyMySQL and redis-py write it in URLs)
    or a duration with its unit (``500ms``, ``2s``), in ASCII digits."""
    value = -1.0
    # float() takes every script's digits ("١٠" is ten): only ASCII text is a number here.
    if text.isascii():
        try:
            value = float(text)
        except ValueError:
            try:
                value = parse_duration(text, what=key) / 1_000_000
            except ConfigurationError:
                pass
    if not 0 < value <= _MAX_TIMEOUT_S:
        ascii_only = ", written in ASCII digits 0-9" if _foreign_digits(text) else ""
        raise ConfigurationError(
            f"backend URL {redacted!r}: {key} must be a positive number of seconds or a "
            f"duration such as 500ms or 5s (at most a year){ascii_only}, not {text!r}"
        )
    return value


URL_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
"""The words a backend URL's yes/no parameter may take."""


def _check_repeated(url: str, redacted: str) -> None:
    """Refuse a query parameter given more than once: each driver keeps one of the values
    (the last, mostly) without a word, so ``timeout=5&timeout=6`` would quietly mean 6."""
    query = url.partition("?")[2]
    names = Counter(urllib.parse.unquote_plus(p.partition("=")[0]) for p in query.split("&") if p)
    repeated = sorted(name for name, count in names.items() if count > 1)
    if repeated:
        raise ConfigurationError(
            f"backend URL {redacted!r}: parameter(s) {', '.join(repeated)} given more than "
            "once; give each once"
        )


def _check_ports(netloc: str, kind: str, redacted: str) -> None:
    """Refuse a port that is not a number from 1 to 65535, for each host of the
    authority (PostgreSQL takes a comma-separated list). Port 0 is no error to a URL
    parser: PyMySQL and redis-py took it for their default port (3306, 6379), and libpq's
    connect to it fails with a message that does not say why."""
    hosts = netloc.rpartition("@")[2]
    for host in hosts.split(",") if kind in LISTED_KINDS else [hosts]:
        if host.startswith("["):  # [IPv6]:port
            port = host.partition("]")[2].removeprefix(":")
        else:
            port = host.partition(":")[2]
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            problem = f"the port must be a number from 1 to 65535, not {port!r}"
            raise ConfigurationError(f"backend URL {redacted!r}: {problem}")


def _take_params(url: str, names: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    """Split the query parameters named ``names`` off ``url``: what is left, and each
    ``(name, value)`` taken, decoded, in the URL's order."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, []
    kept: list[str] = []
    taken: list[tuple[str, str]] = []
    for part in query.split("&"):
        key, _, value = part.partition("=")
        name = urllib.parse.unquote_plus(key)
        if name in names:
            taken.append((name, urllib.parse.unquote_plus(value)))
        elif part:
            kept.append(part)
    return (f"{base}?{'&'.join(kept)}" if kept else base), taken


def _take_timeouts(url: str, redacted: str) -> tuple[str, float, float]:
    """Remove ``timeout`` and ``connect_timeout`` from ``url``'s query; return what is
    left and the two values (defaults when absent)."""
    rest, taken = _take_params(url, _TIMEOUT_PARAMS)
    found = {name: _seconds(value, name, redacted) for name, value in taken}
    return (
        rest,
        found.get("timeout", DEFAULT_TIMEOUT_S),
        found.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S),
    )


# PostgreSQL: whether the driver prepares the statements it runs often (psycopg's
# prepare_threshold). On by default; off behind PgBouncer in transaction pooling before
# 1.21 or without max_prepared_statements, which cannot carry a prepared statement to the
# next server connection.
_PREPARED_PARAM = "prepared_statements"
_SWITCH = {**URL_BOOLEANS, "on": True, "off": False}


def _take_prepared(url: str, kind: str, redacted: str) -> tuple[str, bool]:
    """Remove ``prepared_statements`` from ``url``'s query; return what is left and the
    value (on when absent). Refused on any backend but PostgreSQL."""
    rest, taken = _take_params(url, (_PREPARED_PARAM,))
    value = True
    for _, text in taken:
        if kind != "postgres":
            raise ConfigurationError(
                f"backend URL {redacted!r}: {_PREPARED_PARAM} is a PostgreSQL parameter"
            )
        word = text.strip().lower()
        if word not in _SWITCH:
            raise ConfigurationError(
                f"backend URL {redacted!r}: {_PREPARED_PARAM} must be on or off, not {text!r}"
            )
        value = _SWITCH[word]
    return rest, value


def sqlite_url(path: Path) -> str:
    """The SQLite URL of ``path``, as :func:`parse_store_url` reads it back: ``sqlite:///``
    then the path, so four slashes for an absolute path (``sqlite:////var/lib/fc.db``) and
    three for one relative to the working directory (``sqlite:///fc.db``); ``%``, ``?``
    and ``#`` are percent-encoded."""
    text = str(path)
    for char, code in (("%", "%25"), ("?", "%3F"), ("#", "%23")):
        text = text.replace(char, code)
    return f"sqlite:///{text}"


def _host_spellings(written: str) -> str:
    """How to write the path of ``sqlite://<written>``, where a reader takes a host (as
    SQLAlchemy does): relative to the working directory, and absolute; only the absolute
    one for ``~`` (the home directory); nothing when there is no working directory."""
    path = Path(written)
    relative = f"write {sqlite_url(path)!r} for {written} relative to the working directory"
    try:
        if written.startswith("~"):
            return f"; write {sqlite_url(path.expanduser())!r}"
        absolute = Path.cwd() / path
    except (OSError, RuntimeError):  # a deleted working directory, an unknown home
        return f"; {relative}"
    return f"; {relative}, or {sqlite_url(absolute)!r} for {absolute}"


def _sqlite_url(url: str, rest: str, redacted: str) -> StoreURL:
    """``sqlite:///<path>`` read as SQLAlchemy reads it: what follows the third slash is
    the path, relative to the working directory unless it starts with ``/`` (four
    slashes). ``sqlite://<x>`` is refused: a reader that takes ``<x>`` for a host, as
    SQLAlchemy does, opens another file than one that takes it for a path."""
    written, _, query = rest.partition("?")
    path_text = urllib.parse.unquote(written)
    if "\x00" in path_text:
        raise ConfigurationError(f"backend URL {redacted!r}: the path contains a NUL byte")
    if path_text.lstrip("/") == ":memory:":
        raise ConfigurationError(
            f"backend URL {redacted!r}: an in-memory SQLite database is private to one "
            "connection; use memory:// for a store inside one process, or a file path"
        )
    if path_text and not path_text.startswith("/"):
        raise ConfigurationError(
            f"backend URL {redacted!r}: a SQLite URL has no host; its path follows a third "
            f"slash, relative to the working directory, or a fourth for an absolute path"
            + _host_spellings(path_text)
        )
    path_text = path_text[1:]
    if path_text.startswith("/"):
        path_text = "/" + path_text.lstrip("/")  # //x is /x, as the kernel reads it
    if path_text in ("", "/"):
        raise ConfigurationError(f"backend URL {redacted!r} names no database file")
    _check_repeated(url, redacted)
    params = [p.partition("=")[0] for p in query.split("&") if p]
    if "connect_timeout" in params:
        raise ConfigurationError(
            f"backend URL {redacted!r}: connect_timeout has no meaning for SQLite (there is no "
            "server to connect to); timeout sets how long a writer waits for the lock"
        )
    _, timeout_s, _ = _take_timeouts(url, redacted)
    unknown = sorted({p for p in params if p not in _TIMEOUT_PARAMS})
    if unknown:
        raise ConfigurationError(
            f"backend URL {redacted!r}: unknown parameter(s) {', '.join(unknown)}; a SQLite "
            "store is opened read-write (fleetcron writes leases and runs) and takes only "
            "timeout"
        )
    return StoreURL(
        raw=url,
        kind="sqlite",
        redacted=redacted,
        path=Path(path_text),
        timeout_s=timeout_s,
        driver=url.partition("?")[0],
    )


def parse_store_url(url: str) -> StoreURL:
    """Validate ``url`` and say which backend it names. Nothing is opened here."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("backend URL is empty")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"backend URL {redact(url)!r} has no scheme; use one of "
            "sqlite:////abs/path, postgresql://…, mysql://…, redis://…, memory://"
        )
    kind = SCHEMES.get(scheme.lower())
    if kind is None:
        known = ", ".join(sorted({f"{s}://" for s in SCHEMES}))
        raise ConfigurationError(f"backend URL scheme {scheme!r} is not supported (known: {known})")
    redacted = redact(url)
    if kind not in ("memory", "sqlite") and scheme.lower() != "unix":
        _check_userinfo(url, redacted)  # a file path may hold '@' and '/'
    if kind == "memory":
        if rest.strip("/"):
            raise ConfigurationError(
                f"backend URL {redacted!r}: memory:// takes nothing after the scheme"
            )
        return StoreURL(raw=url, kind=kind, redacted=redacted)
    if kind == "sqlite":
        return _sqlite_url(url, rest, redacted)
    try:
        parts = urllib.parse.urlsplit(url)
        _check_ports(parts.netloc, kind, redacted)
        if kind not in LISTED_KINDS:  # a list of hosts is no port to urlsplit
            _ = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"backend URL {redacted!r} is invalid: {exc}") from None
    _check_repeated(url, redacted)
    if kind != "redis" or scheme.lower() != "unix":
        if not parts.hostname and "host=" not in parts.query:
            raise ConfigurationError(f"backend URL {redacted!r} names no host")
    driver, timeout_s, connect_timeout_s = _take_timeouts(url, redacted)
    driver, prepared = _take_prepared(driver, kind, redacted)
    return StoreURL(
        raw=url,
        kind=kind,
        redacted=redacted,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
        driver=driver,
        prepared_statements=prepared,
    )
