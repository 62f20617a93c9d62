"""Stores behind backend URLs: ``memory://``, ``sqlite:///…``, ``postgresql://…``,
``mysql://…`` and ``redis://…``. See :mod:`fleetcron.stores.base` for the contract."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence

from fleetcron._log import log
from fleetcron.errors import ConfigurationError
from fleetcron.stores.backends import backend, entry_points, missing_driver
from fleetcron.stores.base import AsyncStore, Capability, SyncStore
from fleetcron.stores.url import (
    StoreURL,
    default_sqlite_path,
    parse_store_url,
    sqlite_url,
    url_passwords,
)

__all__ = [
    "AsyncStore",
    "Capability",
    "StoreURL",
    "SyncStore",
    "async_face",
    "open_async_store",
    "open_existing_store",
    "open_store",
    "parse_store_url",
    "read_backend_file",
    "resolve_backend",
]

BACKEND_ENV = "FLEETCRON_BACKEND"
BACKEND_FILE_ENV = "FLEETCRON_BACKEND_FILE"
BACKEND_FILE_LIMIT = 65_536  # bytes: a backend file holds one URL


def resolve_backend(explicit: str | None = None, configured: str | None = None) -> StoreURL:
    """Pick the backend URL: explicit > ``$FLEETCRON_BACKEND`` > the file named by
    ``$FLEETCRON_BACKEND_FILE`` > jobs file > SQLite default. (The CLI's ``--backend-file``
    comes in as ``explicit``, below ``--backend``.)"""
    for candidate in (explicit, os.environ.get(BACKEND_ENV) or None):
        if candidate is not None:
            return parse_store_url(candidate)
    backend_file = os.environ.get(BACKEND_FILE_ENV)
    if backend_file:
        return parse_store_url(read_backend_file(backend_file, source=f"${BACKEND_FILE_ENV}"))
    if configured is not None:
        return parse_store_url(configured)
    path = default_sqlite_path()
    url = sqlite_url(path)
    return StoreURL(raw=url, kind="sqlite", redacted=url, path=path)


_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO or pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_backend_file(path: str, *, source: str) -> str:
    """The backend URL in the file at ``path``: its first line, whitespace stripped.

    ``source`` (``--backend-file``, ``$FLEETCRON_BACKEND_FILE``) is named in the errors.
    Refused with a :class:`ConfigurationError` naming the path: a file that does not
    exist or cannot be read, anything but a regular file (a FIFO is never waited on),
    more than 64 KiB, an empty first line, a first line that is not a valid backend URL
    (never echoed when it has no scheme: it may be a bare password). A file other users
    can read is used, with a warning (``store_warning``).
    """
    where = f"backend file {path!r} (from {source})"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigurationError(f"{where} does not exist") from None
    except OSError as exc:
        raise ConfigurationError(f"{where} cannot be read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        regular = stat.S_ISREG(mode)
        data = b""
        if regular:  # only: a FIFO would block, a device might never end
            with os.fdopen(fd, "rb", closefd=False) as file:
                data = file.read(BACKEND_FILE_LIMIT + 1)
    except OSError as exc:
        raise ConfigurationError(f"{where} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if not regular:
        kind = next((name for test, name in _FILE_TYPES if test(mode)), "not a file")
        raise ConfigurationError(f"{where} is not a regular file: it is {kind}")
    if len(data) > BACKEND_FILE_LIMIT:
        raise ConfigurationError(f"{where} is larger than 64 KiB; it holds one backend URL")
    try:
        text = data.decode("utf-8-sig")  # an editor's byte order mark is not the URL's
    except UnicodeDecodeError:
        raise ConfigurationError(f"{where} is not UTF-8 text") from None
    if not text.strip():
        raise ConfigurationError(f"{where} is empty; write the backend URL on its first line")
    url = text.splitlines()[0].strip()
    if not url:
        raise ConfigurationError(f"{where}: the first line is empty; the URL goes there")
    if "://" not in url:
        raise ConfigurationError(
            f"{where}: the first line is not a backend URL (scheme://…); the file holds "
            "the whole URL, password included, e.g. postgresql://app:PASSWORD@db/app"
        )
    try:
        parse_store_url(url)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc.message}") from None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning(
            "%s can be read by other users (mode %04o): chmod go-r it",
            where,
            stat.S_IMODE(mode),
            extra={"action": "store_warning", "path": path},
        )
    return url


def _warn_if_on_command_line(url: StoreURL, argv: Sequence[str] | None = None) -> None:
    """A URL holding a password that stands in this process's command line can be read by
    every process on the host (``ps``, ``/proc/PID/cmdline``): say so, once the store
    answered (a URL refused or a store unreachable gets its one error line only)."""
    arguments = sys.argv if argv is None else argv
    if url_passwords(url.raw) and any(url.raw in argument for argument in arguments):
        log.warning(
            "the backend URL %s holds a password and is on the command line, where every "
            "process on this host can read it (ps, /proc/PID/cmdline); pass it in "
            "$FLEETCRON_BACKEND or in a file named by --backend-file instead",
            url.redacted,
            extra={"action": "store_warning", "store": url.redacted},
        )


def open_store(url: StoreURL, *, auto_migrate: bool = True, create: bool = True) -> SyncStore:
    """Connect a sync store of the backend ``url`` names (:mod:`fleetcron.stores.backends`).
    Raises ``StoreUnavailable`` / ``ConfigurationError``.

    ``create=False`` opens the store as it is and writes nothing on opening: a SQLite file
    that does not exist raises :class:`~fleetcron.errors.StoreMissing` (neither it nor its
    directory is made), Redis's persistence marker is read instead of set, and no schema is
    created or upgraded (``auto_migrate`` is ignored). :func:`open_existing_store` also
    checks that the schema is there and current."""
    entry = backend(url.kind)
    module = entry_points(entry)
    try:
        store: SyncStore = module.open_sync(
            url, create=create, auto_migrate=auto_migrate and create
        )
    except ImportError as exc:  # a driver imported on first use
        raise missing_driver(entry, exc) from None
    _warn_if_on_command_line(url)
    return store


def open_existing_store(url: StoreURL) -> SyncStore:
    """The store at ``url`` for a command that only reads it, or changes only rows that
    must be there already (``status``, ``runs``, ``locks``, ``pause``…): opened with
    ``create=False``, then refused unless it holds this fleetcron's schema —
    :class:`~fleetcron.errors.StoreMissing` when there is none (a mistyped path or
    database is said, never answered from an empty store made for the occasion),
    :class:`~fleetcron.errors.SchemaError` when it is older or newer. A store that keeps
    no schema (Redis, memory: no ``require_schema()``) exists whenever it answers."""
    store = open_store(url, create=False)
    try:
        require = getattr(store, "require_schema", None)
        if callable(require):
            require()
    except BaseException:
        store.close()
        raise
    return store


async def open_async_store(url: StoreURL, *, existing: bool = False) -> AsyncStore:
    """Connect an async store: the backend's own asyncio store when it has one
    (PostgreSQL, MySQL, Redis), else its sync store in a worker thread (SQLite: a local
    file, no network wait).

    ``existing``: open it as :func:`open_existing_store` does (nothing created, migrated or
    written on opening; a store that is not there, or not at this fleetcron's schema, is
    refused)."""
    entry = backend(url.kind)
    module = entry_points(entry)
    native = getattr(module, "open_async", None)
    if native is None:
        import asyncio

        from fleetcron.bridge import ThreadedAsyncStore

        opener = open_existing_store if existing else open_store
        return ThreadedAsyncStore(await asyncio.to_thread(opener, url))
    try:
        store: AsyncStore = await native(url, create=not existing, migrate=not existing)
    except ImportError as exc:
        raise missing_driver(entry, exc) from None
    _warn_if_on_command_line(url)
    return store


def async_face(store: SyncStore) -> AsyncStore:
    """An async store over the open sync ``store``, sharing its state: the store's own
    async twin when it has one (``async_twin()``: the in-memory store, whose fleet lives
    in that one object), else each operation in a worker thread
    (:class:`~fleetcron.bridge.ThreadedAsyncStore`)."""
    twin = getattr(store, "async_twin", None)
    if callable(twin):
        face: AsyncStore = twin()
        return face
    from fleetcron.bridge import ThreadedAsyncStore

    return ThreadedAsyncStore(store)
