"""Client (and server) clock faults: a process's wall clock offset or stepped by libfaketime.

Debian's libfaketime is preloaded into a child (``LD_PRELOAD``); it shifts ``CLOCK_REALTIME``
(Python's ``time.time()``, a server's ``now()``) and, with ``FAKETIME_DONT_FAKE_MONOTONIC=1``,
leaves ``CLOCK_MONOTONIC`` (``time.monotonic()``) real, so histories stay comparable across
processes.

- :func:`faketime_env` — a fixed offset for the life of the child (``FAKETIME="+600s"``).
- :class:`SteppableClock` — an offset read from a file on every clock call
  (``FAKETIME_TIMESTAMP_FILE`` + ``FAKETIME_NO_CACHE=1``), so :meth:`SteppableClock.step`
  moves the clock of every child started with its :attr:`~SteppableClock.env` while they run.
  Measured here: a child's ``time.time()`` shows the new offset 0.6 ms (median; 6.5 ms at
  worst) after the write; each faked wall-clock call costs ~7 µs (it re-reads the file).

libfaketime 0.9.10 (Debian 12) has a bug with ``DONT_FAKE_MONOTONIC``: it rewrites the
deadline of ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` — which Python >= 3.11's
``time.sleep`` (and so ``subprocess.Popen.wait(timeout)``) uses — so that call fails with
``EINVAL`` (wolfcw/libfaketime#426). Every environment from this module therefore preloads a
small shim ahead of libfaketime that sends monotonic sleeps straight to the kernel; it is
compiled with the system's C compiler on first use (``cc``, ~0.2 s) into a private temporary
directory. Other waits (``Event.wait``, ``select``, socket timeouts, asyncio) are unaffected.
``libc.so.6`` is preloaded last so ``malloc`` is glibc's: that lets libfaketime run in a
program linked with jemalloc (Debian's ``redis-server``), which otherwise deadlocks at start
(wolfcw/libfaketime#130). Tested with Python workers, redis-server, postgres and mariadbd.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = [
    "FaketimeUnavailable",
    "SteppableClock",
    "faketime_env",
    "faketime_spec",
    "libfaketime_path",
]

_SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* libfaketime 0.9.10 mangles absolute CLOCK_MONOTONIC deadlines even when told not to fake
   the monotonic clock (wolfcw/libfaketime#426). The monotonic clocks are real here, so sleep
   on them in the kernel; the wall clocks still go through libfaketime. */
typedef int (*next_t)(clockid_t, int, const struct timespec *, struct timespec *);

int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
    if (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE && id != CLOCK_TAI) {
        return syscall(SYS_clock_nanosleep, id, flags, req, rem) == 0 ? 0 : errno;
    }
    static next_t next;
    if (next == NULL) {
        next = (next_t)dlsym(RTLD_NEXT, "clock_nanosleep");
    }
    return next(id, flags, req, rem);
}
"""

_shim_lock = threading.Lock()
_shim: str | None = None


class FaketimeUnavailable(RuntimeError):
    """libfaketime (Debian package ``faketime``) or a C compiler for the shim is missing."""


def libfaketime_path() -> str:
    """The path of Debian's ``libfaketime.so.1``; :class:`FaketimeUnavailable` without it."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise FaketimeUnavailable("libfaketime is not installed (apt-get install faketime)")
    return found[0]


def _shim_path() -> str:
    """Compile (once per process) and return the ``clock_nanosleep`` shim."""
    global _shim
    with _shim_lock:
        if _shim is not None:
            return _shim
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise FaketimeUnavailable(
                "a C compiler (cc) is needed to build the libfaketime sleep shim"
            )
        directory = Path(tempfile.mkdtemp(prefix="fleetcron-faketime-"))
        atexit.register(shutil.rmtree, directory, True)
        directory.chmod(0o755)  # a server run as another user (postgres) preloads it too
        source = directory / "monotonic_sleep.c"
        source.write_text(_SHIM_SOURCE)
        target = directory / "monotonic_sleep.so"
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(target), str(source), "-ldl"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise FaketimeUnavailable(f"building the libfaketime sleep shim failed: {done.stderr}")
        target.chmod(0o755)
        _shim = str(target)
        return _shim


def faketime_spec(offset_s: float) -> str:
    """libfaketime's relative offset syntax for ``offset_s`` seconds (``+600s``, ``-1.5s``)."""
    return f"{offset_s:+.6f}".rstrip("0").rstrip(".") + "s"


def _base_env() -> dict[str, str]:
    return {
        # libc last: malloc resolves to glibc's, not to a jemalloc the program links
        # (redis-server) whose initialisation deadlocks with libfaketime's (libfaketime#130).
        "LD_PRELOAD": f"{_shim_path()}:{libfaketime_path()}:libc.so.6",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "DONT_FAKE_MONOTONIC": "1",  # the name older libfaketime releases read
    }


def faketime_env(offset_s: float) -> dict[str, str]:
    """Environment variables that run a child ``offset_s`` seconds ahead (negative: behind)
    on the wall clock, monotonic clock real. Merge them into the child's environment:
    ``env={**os.environ, **faketime_env(600)}`` (they replace any ``LD_PRELOAD``)."""
    return {**_base_env(), "FAKETIME": faketime_spec(offset_s)}


class SteppableClock:
    """A wall-clock offset shared by every child started with :attr:`env`, changeable while
    they run: :meth:`set` / :meth:`step` rewrite the file libfaketime reads on each clock call.

    The file lives in ``directory`` (a new private temporary directory by default, readable by
    other users so a server running as ``postgres`` can use it); :meth:`close` removes it.
    """

    def __init__(self, offset_s: float = 0.0, *, directory: Path | None = None) -> None:
        self._owned = directory is None
        self.directory = (
            Path(tempfile.mkdtemp(prefix="fleetcron-clock-")) if directory is None else directory
        )
        self.directory.chmod(0o755)
        self.path = self.directory / "faketime.rc"
        self._offset_s = 0.0
        self.set(offset_s)
        self.env: dict[str, str] = {
            **_base_env(),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
        }
        """Variables to merge into a child's environment (no ``FAKETIME``: it would win)."""
        atexit.register(self.close)

    @property
    def offset_s(self) -> float:
        """The offset the children see now."""
        return self._offset_s

    def set(self, offset_s: float) -> None:
        """Set the children's wall clock to real time + ``offset_s`` (atomic file replace)."""
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(faketime_spec(offset_s) + "\n")
        scratch.chmod(0o644)
        os.replace(scratch, self.path)
        self._offset_s = offset_s

    def step(self, delta_s: float) -> None:
        """Step the children's wall clock by ``delta_s`` seconds (forward or back)."""
        self.set(self._offset_s + delta_s)

    def close(self) -> None:
        """Remove the file (children still running fall back to the real clock)."""
        atexit.unregister(self.close)
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)
