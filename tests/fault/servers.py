"""Store servers the fault suite owns, and the filesystems a SQLite file is put on.

Each server runs on a spare port of 127.0.0.1 with its data in a private temporary
directory, so a scenario may stop, kill, pause or restart it; the machine's own services
(5432, 3306, 6379) are never touched. Common API (:class:`_Server`):

- ``.url`` (a fleetcron backend URL), ``.port``, ``.pid`` (the server's main process),
  ``.running``, ``.paused``, ``.log_path``, :meth:`~_Server.log_tail`;
- :meth:`~_Server.start` (waits until it answers queries), ``stop(...)``, ``restart(...)``,
  :meth:`~_Server.kill9` (SIGKILL of the server and every process it forked — a crash),
  :meth:`~_Server.pause` / :meth:`~_Server.resume` (SIGSTOP / SIGCONT of the same set; returns
  once all of them are stopped), :meth:`~_Server.close` (always cleans up; also run at exit and
  by ``with``).

Data live under :func:`data_parent` (``/dev/shm`` when it has room: see there). The
constructor starts the server. ``directory`` (e.g. pytest's ``tmp_path``; created if missing)
only receives the server's log, kept after :meth:`~_Server.close` for a post-mortem (without
it the log goes with the data); ``env`` is merged into
the server's environment (e.g. :attr:`fault.clock.SteppableClock.env` to step the *store's*
clock). Failures raise :class:`ServerError` (with the log's tail), not pytest outcomes, so the
harness runs outside pytest too.

- :class:`PostgresCluster` — PostgreSQL 15 (``initdb`` once per process into a template,
  copied per instance), trust auth, fsync on; run as the ``postgres`` OS user when we are root.
- :class:`MariaDbInstance` — ``mariadbd`` (``mariadb-install-db`` template), root without a
  password, database ``test``.
- :class:`RedisInstance` — ``redis-server`` with ``persistence`` none / aof / rdb.

Filesystems for SQLite (root only: they mount): :func:`small_tmpfs` and :func:`read_only_dir`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal, Self

import psycopg
import pymysql
import redis

from ports import spare_port

__all__ = [
    "MariaDbInstance",
    "PostgresCluster",
    "RedisInstance",
    "ServerError",
    "data_parent",
    "read_only",
    "read_only_dir",
    "small_tmpfs",
]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
START_TIMEOUT_S = 60.0  # a loaded CI machine: crash recovery included
STOP_TIMEOUT_S = 60.0


class ServerError(RuntimeError):
    """A server did not start, answer or stop in time; the message has its log's tail."""


def data_parent() -> Path:
    """Where servers keep their data: ``$FLEETCRON_FAULT_DATA_DIR``, else ``/dev/shm`` when it
    has room (a tmpfs: fsync stays on but costs nothing, so crash recovery, which fsyncs the
    whole data directory, takes a fraction of a second instead of seconds on a slow disk),
    else the system's temporary directory. The faults here are process crashes, after which
    the OS still has every write, on any filesystem; a power loss is not simulated."""
    chosen = os.environ.get("FLEETCRON_FAULT_DATA_DIR")
    if chosen:
        return Path(chosen)
    with contextlib.suppress(OSError):
        shm = os.statvfs("/dev/shm")
        if shm.f_bavail * shm.f_frsize > 2 * 1024**3 and os.access("/dev/shm", os.W_OK):
            return Path("/dev/shm")
    return Path(tempfile.gettempdir())


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until true; :class:`ServerError` naming ``what`` after ``timeout``."""
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            raise ServerError(f"{what}: not within {timeout:g} s")
        time.sleep(0.02)  # polling a condition, bounded above


# -- processes ------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid`` from /proc, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _descendants(root: int) -> list[int]:
    """Every live process below ``root``, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                children.setdefault(found[1], []).append(int(entry))
    result: list[int] = []
    todo = [root]
    while todo:
        below = children.get(todo.pop(), [])
        result += below
        todo += below
    return result


def _stopped(pid: int) -> bool:
    found = _stat(pid)
    return found is None or found[0] in ("T", "t", "Z", "X")


def _all_stopped(pids: list[int]) -> bool:
    return all(_stopped(pid) for pid in pids)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _stop_tree(root: int, what: str) -> None:
    """SIGSTOP ``root`` (so it forks no more), then every descendant; wait until all stopped."""
    _signal(root, signal.SIGSTOP)
    wait_until(lambda: _stopped(root), 10, f"{what} to stop on SIGSTOP")
    while True:
        running = [pid for pid in _descendants(root) if not _stopped(pid)]
        if not running:
            return
        for pid in running:
            _signal(pid, signal.SIGSTOP)
        wait_until(functools.partial(_all_stopped, running), 10, f"{what} children to stop")


class _Server:
    """What every owned server shares; see the module docstring."""

    kind = "server"
    run_as: str | None = None
    """The OS user the server runs as (``postgres`` for PostgreSQL when we are root)."""

    def __init__(self, directory: Path | None, env: Mapping[str, str] | None) -> None:
        self.port = spare_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"fleetcron-{self.kind}-", dir=data_parent()))
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        self.log_path = (directory or self.root) / f"{self.kind}-{self.port}.log"
        self.env = dict(env or {})
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._paused = False
        self._closed = False
        self._lock = threading.RLock()
        atexit.register(self.close)

    # -- to be provided by each server ------------------------------------------------------
    @property
    def url(self) -> str:
        raise NotImplementedError

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        """One quick query (short timeouts): True when the server serves."""
        raise NotImplementedError

    # -- the common part --------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int:
        """The server's main process (the postmaster, mariadbd, redis-server)."""
        if self._process is None:
            raise ServerError(f"{self.kind} is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        """Started and not yet exited (paused counts as running)."""
        return self._process is not None and self._process.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, message: str) -> ServerError:
        return ServerError(f"{self.kind} on port {self.port}: {message}\n{self.log_tail()}")

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the server and wait until it answers a query."""
        with self._lock:
            if self._closed:
                raise self._fail("closed")
            if self.running:
                raise self._fail("already running")
            if self._log is None:
                self._log = self.log_path.open("ab")
            self._log.write(f"--- fault suite: starting {self._command()}\n".encode())
            self._log.flush()
            self._process = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # a terminal's ^C hits the test, not the server
                user=self.run_as,
                group=self.run_as,
                extra_groups=None if self.run_as is None else [],
                cwd="/",
            )
            self._paused = False
            process = self._process
            give_up = time.monotonic() + timeout
            while not self._answers():
                if process.poll() is not None:
                    raise self._fail(f"exited with {process.returncode} while starting")
                if time.monotonic() > give_up:
                    raise self._fail(f"did not answer within {timeout:g} s")
                time.sleep(0.02)  # polling for the server to answer, bounded above

    def _signal_and_wait(self, sig: int, timeout: float = STOP_TIMEOUT_S) -> None:
        """Send ``sig`` to the main process (continued first if paused) and reap it."""
        process = self._process
        if process is None:
            return
        if self._paused:
            self.resume()
        _signal(process.pid, sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise self._fail(f"did not exit within {timeout:g} s of signal {sig}") from None
        self._process = None

    def kill9(self) -> None:
        """SIGKILL the server and every process it forked, at once (a crash: what the server
        wrote to the OS survives, what it only held in memory is lost)."""
        with self._lock:
            process = self._process
            if process is None:
                return
            if process.poll() is None:
                _stop_tree(process.pid, self.kind)  # no fork can slip between the kills
                for pid in [process.pid, *_descendants(process.pid)]:
                    _signal(pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)
            self._process = None
            self._paused = False

    def pause(self) -> None:
        """SIGSTOP the server and every process it forked; returns once all are stopped.
        Clients' connects complete (the kernel's backlog) but nothing answers."""
        with self._lock:
            if self._process is None or self._paused:
                return
            _stop_tree(self._process.pid, self.kind)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT what :meth:`pause` stopped."""
        with self._lock:
            if self._process is None or not self._paused:
                return
            root = self._process.pid
            for pid in [*_descendants(root), root]:
                _signal(pid, signal.SIGCONT)
            self._paused = False

    def close(self) -> None:
        """Stop the server whatever its state and remove its data (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            atexit.unregister(self.close)
            try:
                if self.running:
                    try:
                        self._quick_stop()
                    except ServerError:
                        self.kill9()
                self.kill9()  # anything left (a failed start)
                self._cleanup()
            finally:
                if self._log is not None:
                    self._log.close()
                shutil.rmtree(self.root, ignore_errors=True)

    def _quick_stop(self) -> None:
        self._signal_and_wait(signal.SIGTERM, timeout=20)

    def _cleanup(self) -> None:
        """Release what a crashed server left outside its directory."""


# -- PostgreSQL ----------------------------------------------------------------------------
_templates: dict[str, Path] = {}
_templates_lock = threading.Lock()
_templates_root: Path | None = None


def _template_dir(kind: str, build: Callable[[Path], None]) -> Path:
    """A data directory built once per process by ``build`` and copied per instance."""
    global _templates_root
    with _templates_lock:
        if kind not in _templates:
            if _templates_root is None:
                _templates_root = Path(
                    tempfile.mkdtemp(prefix="fleetcron-templates-", dir=data_parent())
                )
                atexit.register(shutil.rmtree, _templates_root, True)
            target = _templates_root / kind
            target.mkdir(mode=0o755)  # the postgres user walks into it
            os.chmod(_templates_root, 0o755)
            try:
                build(target)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            _templates[kind] = target
        return _templates[kind]


def _copy_tree(source: Path, target: Path) -> None:
    """``cp -a``: ownership and modes kept (PostgreSQL insists on a 0700 data directory)."""
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)


def _run_logged(command: Sequence[str], what: str, *, user: str | None = None) -> None:
    done = subprocess.run(
        list(command),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        user=user,
        group=user,
        extra_groups=None if user is None else [],
        cwd="/",
    )
    if done.returncode != 0:
        raise ServerError(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _postgres_user() -> str | None:
    """Whom initdb and postgres run as: the ``postgres`` OS user when we are root (they refuse
    root). Done by ``Popen(user=…)`` rather than ``runuser -u postgres --``: no wrapper
    process, so the postmaster is our direct child and its pid is ``Popen.pid``."""
    return "postgres" if os.geteuid() == 0 else None


def _chown_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(path, entry.pw_uid, entry.pw_gid)


PgStopMode = Literal["smart", "fast", "immediate"]
PgRestartMode = Literal["smart", "fast", "immediate", "kill9"]
_PG_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


class PostgresCluster(_Server):
    """A PostgreSQL 15 cluster of our own: ``postgres -D`` (what ``pg_ctl`` runs) on a spare
    port of 127.0.0.1, unix socket in its directory, trust authentication, fsync on.

    ``settings`` are server settings (``{"default_transaction_isolation": "serializable"}``),
    given as ``-c name=value`` on every start. ``stop(mode)`` sends what ``pg_ctl stop -m
    mode`` sends (smart SIGTERM, fast SIGINT, immediate SIGQUIT: no checkpoint, crash
    recovery on the next start) and waits for the postmaster to exit.
    """

    kind = "postgres"

    def __init__(
        self,
        directory: Path | None = None,
        *,
        settings: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(directory, env)
        self.settings = dict(settings or {})
        self.run_as = _postgres_user()
        try:
            _chown_postgres(self.root)
            self.data = self.root / "data"
            _copy_tree(_template_dir("postgres", _initdb), self.data)
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _command(self) -> list[str]:
        settings = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "fsync": "on",
            "synchronous_commit": "on",
            "logging_collector": "off",
            **self.settings,
        }
        command = [str(PG_BIN / "postgres"), "-D", str(self.data)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        return command

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def stop(self, mode: PgStopMode = "fast") -> None:
        """``pg_ctl stop -m mode`` and wait until the postmaster exited."""
        with self._lock:
            self._signal_and_wait(_PG_SIGNALS[mode])

    def restart(self, mode: PgRestartMode = "immediate") -> None:
        """Stop (``kill9`` for a crash) and start again on the same port and data."""
        with self._lock:
            if mode == "kill9":
                self.kill9()
            else:
                self.stop(mode)
            self.start()

    def _quick_stop(self) -> None:
        self._signal_and_wait(signal.SIGQUIT, timeout=20)

    def _cleanup(self) -> None:
        # A SIGKILLed postmaster leaves its small System V segment behind (the next start
        # on this directory would remove it; there is none): free it.
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, NotADirectoryError):
            return
        if len(lines) > 6 and len(lines[6].split()) == 2:
            subprocess.run(["ipcrm", "-m", lines[6].split()[1]], capture_output=True, check=False)


def _initdb(target: Path) -> None:
    _chown_postgres(target)
    _run_logged(
        [
            str(PG_BIN / "initdb"),
            "-D",
            str(target),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",  # the template is copied; each instance runs with fsync on
        ],
        "initdb",
        user=_postgres_user(),
    )


# -- MariaDB -------------------------------------------------------------------------------
_MARIADB_OPTIONS = [
    "--no-defaults",
    "--user=root",  # mariadbd runs as root only when told so (we own the data as root)
    "--skip-name-resolve",
    "--innodb-log-file-size=8M",  # the default 96M log would be copied per instance
    "--innodb-buffer-pool-size=32M",
]

MariaDbRestartMode = Literal["clean", "kill9"]


class MariaDbInstance(_Server):
    """``mariadbd`` of our own on a spare port of 127.0.0.1: ``mysql://root@127.0.0.1:PORT/test``
    (root without a password, ``--auth-root-authentication-method=normal``), InnoDB with
    ``innodb_flush_log_at_trx_commit=1`` (the default: a commit is on disk). ``settings`` are
    extra server options (``{"innodb_lock_wait_timeout": "5"}`` → ``--innodb_lock_wait_timeout=5``).
    """

    kind = "mariadb"

    def __init__(
        self,
        directory: Path | None = None,
        *,
        settings: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(directory, env)
        self.settings = dict(settings or {})
        try:
            self.data = self.root / "data"
            _copy_tree(_template_dir("mariadb", _install_db), self.data)
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/test"

    def _command(self) -> list[str]:
        binary = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        return [
            binary,
            *_MARIADB_OPTIONS,
            f"--datadir={self.data}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.root / 'mariadb.sock'}",
            f"--pid-file={self.root / 'mariadb.pid'}",
            *(f"--{name}={value}" for name, value in self.settings.items()),
        ]

    def _answers(self) -> bool:
        try:
            conn = pymysql.connect(
                host="127.0.0.1",
                port=self.port,
                user="root",
                database="test",
                connect_timeout=2,
                read_timeout=5,
            )
        except pymysql.Error:
            return False
        conn.close()
        return True

    def stop(self) -> None:
        """A clean shutdown (SIGTERM) and wait for the exit."""
        with self._lock:
            self._signal_and_wait(signal.SIGTERM)

    def restart(self, mode: MariaDbRestartMode = "kill9") -> None:
        """Crash (``kill9``: InnoDB recovers on start) or ``clean`` stop, then start again."""
        with self._lock:
            if mode == "kill9":
                self.kill9()
            else:
                self.stop()
            self.start()


def _install_db(target: Path) -> None:
    binary = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if binary is None:
        raise ServerError("mariadb-install-db is not installed (apt-get install mariadb-server)")
    target.chmod(0o700)
    _run_logged(
        [
            binary,
            *_MARIADB_OPTIONS,
            f"--datadir={target}",
            "--auth-root-authentication-method=normal",
        ],
        "mariadb-install-db",
    )
    if not (target / "test").is_dir():
        (target / "test").mkdir(mode=0o700)  # CREATE DATABASE test, on disk


# -- Redis ---------------------------------------------------------------------------------
RedisPersistence = Literal["none", "aof", "rdb"]
RedisRestartMode = Literal["save", "nosave", "kill9"]


class RedisInstance(_Server):
    """``redis-server`` of our own on a spare port of 127.0.0.1 (``redis://…/0``).

    ``persistence``: ``none`` (``save ""``, no AOF: a restart loses everything), ``aof``
    (``appendonly yes``, ``appendfsync`` as given, ``always`` by default: nothing
    acknowledged is lost, even on kill -9), ``rdb`` (snapshots ``save 1 1``: a clean
    ``SHUTDOWN`` saves, ``SHUTDOWN NOSAVE`` / kill -9 lose what came after the last snapshot).
    ``options`` are extra ``redis-server`` arguments (``["--maxmemory", "10mb"]``).
    """

    kind = "redis"

    def __init__(
        self,
        directory: Path | None = None,
        *,
        persistence: RedisPersistence = "none",
        appendfsync: Literal["always", "everysec", "no"] = "always",
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(directory, env)
        if persistence not in ("none", "aof", "rdb"):
            raise ValueError(f"persistence must be none, aof or rdb, not {persistence!r}")
        self.persistence = persistence
        self.appendfsync = appendfsync
        self.options = list(options)
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerError("redis-server is not installed")
        persistence = {
            "none": ["--save", "", "--appendonly", "no"],
            "aof": ["--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync],
            "rdb": ["--save", "1 1", "--appendonly", "no"],
        }[self.persistence]
        return [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.root),
            "--daemonize",
            "no",
            *persistence,
            *self.options,
        ]

    def _client(self, timeout: float = 2) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=timeout, socket_connect_timeout=2)

    def _answers(self) -> bool:
        try:
            with self._client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def _shutdown(self, how: str) -> None:
        with self._lock:
            process = self._process
            if process is None:
                return
            if self._paused:
                self.resume()
            # SHUTDOWN answers nothing on success: the server closes the connection.
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as conn:
                conn.sendall(f"SHUTDOWN {how}\r\n".encode())
                with contextlib.suppress(OSError):
                    reply = conn.recv(256)
                    if reply.startswith(b"-"):
                        raise self._fail(f"SHUTDOWN {how} refused: {reply!r}")
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill9()
                raise self._fail("did not exit after SHUTDOWN") from None
            self._process = None

    def stop(self) -> None:
        """``SHUTDOWN`` (saves a snapshot when ``rdb``; flushes the AOF) and wait for the exit."""
        self._shutdown("SAVE" if self.persistence == "rdb" else "")

    def shutdown_nosave(self) -> None:
        """``SHUTDOWN NOSAVE``: exit without a snapshot (the AOF is still flushed)."""
        self._shutdown("NOSAVE")

    def restart(self, mode: RedisRestartMode = "nosave") -> None:
        """``save`` (:meth:`stop`), ``nosave`` (:meth:`shutdown_nosave`) or ``kill9``, then
        start again on the same port and directory."""
        with self._lock:
            {"save": self.stop, "nosave": self.shutdown_nosave, "kill9": self.kill9}[mode]()
            self.start()

    def _quick_stop(self) -> None:
        self.kill9()


# -- filesystems for SQLite ----------------------------------------------------------------
def _umount(path: Path) -> None:
    done = subprocess.run(["umount", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:  # busy (a process still has a file open): detach it lazily
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextlib.contextmanager
def small_tmpfs(size_bytes: int) -> Iterator[Path]:
    """A new tmpfs of ``size_bytes`` (rounded up to pages) mounted on a temporary directory:
    writing more fails with ``ENOSPC``. Unmounted and removed on exit. Needs root."""
    mountpoint = Path(tempfile.mkdtemp(prefix="fleetcron-tmpfs-"))
    try:
        _run_logged(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={size_bytes},mode=0755",
                "tmpfs",
                str(mountpoint),
            ],
            "mount -t tmpfs",
        )
        try:
            yield mountpoint
        finally:
            _umount(mountpoint)
    finally:
        with contextlib.suppress(OSError):
            mountpoint.rmdir()


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    """Make the directory ``path`` read-only for the block: a read-only bind mount of it on
    itself (root ignores permission bits, so ``chmod`` would not do). Opening, creating,
    writing or deleting anything under it then fails with ``EROFS`` — for files opened *after*
    the mount; a file already open for writing keeps writing through its old descriptor.
    Needs root."""
    _run_logged(["mount", "--bind", str(path), str(path)], "mount --bind")
    try:
        _run_logged(["mount", "-o", "remount,bind,ro", str(path)], "mount -o remount,bind,ro")
        yield path
    finally:
        _umount(path)


read_only = read_only_dir
"""The name the design note uses."""
