"""The database file a SQLite store opened, and whether its path still names it.

SQLite looks a database up by its path only when it opens it; from then on it reads and
writes the file it holds open. Deleted (``rm store.db*``), renamed away or replaced
(``mv other.db store.db``) under running processes, that file lives on, unlinked, for the
processes that hold it — and a process started afterwards opens or creates another one at
the path. The two groups share a path, not a store: each runs every slot once in its own
file. So a store remembers the device and inode of the file it opened and checks, before
every transaction and after its commit (a ``stat`` each, a few microseconds), that the
path still names it. Once it does not, the store does nothing more in that file, ever: it
says so with :class:`~fleetcron.errors.StoreReplaced` at every call.

Nothing at all is written, outcomes included, not only claims: the write-ahead log and
the shared-memory index (``store.db-wal``, ``store.db-shm``) are found by name, so after
``mv other.db store.db`` the old ones stay beside the new file, and every frame written
through them would be read as part of it.
"""

from __future__ import annotations

import os
from pathlib import Path

from fleetcron.errors import StoreReplaced, StoreUnavailable

__all__ = ["DatabaseFile"]

_NOTHING = "no file is at that path now"
_ANOTHER = "another file is at that path now"


def _identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file ``path`` names now; ``None`` when it names none."""
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise StoreUnavailable(
            f"cannot tell whether SQLite database {path} is still the file this process "
            f"opened: {exc.strerror or exc}"
        ) from None
    return found.st_dev, found.st_ino


class DatabaseFile:
    """The file a store opened at ``path``: :meth:`opened` after each connect,
    :meth:`check` before each transaction and after its commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._where = os.fspath(path)  # checked four times a lock cycle: no Path per stat
        self._identity: tuple[int, int] | None = None
        self._gone: str | None = None  # what the path named when it stopped naming the file

    def opened(self) -> None:
        """Remember the file the path names, just opened by SQLite. Only the first
        connection's counts: a connection made again later must have found the same file."""
        if self._identity is None and self._gone is None:
            found = _identity(self._where)
            if found is None:  # deleted between SQLite's open and this stat
                self._gone = _NOTHING
            self._identity = found
        self.check()

    def check(self) -> None:
        """Raise :class:`~fleetcron.errors.StoreReplaced` unless the path still names the
        file opened first. Once it has not, it never does again for this store: the
        process that noticed does nothing more in either file."""
        if self._gone is None and self._identity is not None:
            now = _identity(self._where)
            if now == self._identity:
                return
            self._gone = _NOTHING if now is None else _ANOTHER
        if self._gone is not None:
            raise StoreReplaced(
                f"SQLite database {self.path} was deleted or replaced since this process "
                f"opened it ({self._gone}): it does nothing more in the file it holds, which "
                "nothing opening the path sees; restart it (or open the store again) to use "
                "the database there now"
            )
