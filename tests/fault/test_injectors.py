"""The fault injectors do what they say: owned servers survive or lose what they should on a
restart, pause and resume; the proxy delays, holds, resets and half-closes; libfaketime moves
only the wall clock, also while the child runs; the SQLite filesystems fill up and refuse
writes. Each check waits on a condition with a generous bound, never a fixed sleep — except
where it proves that something does *not* happen within a short window."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import psycopg
import pymysql
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fault.clock import FaketimeUnavailable, SteppableClock, faketime_env, faketime_spec
from fault.proxy import FaultProxy
from fault.servers import (
    PG_BIN,
    MariaDbInstance,
    PostgresCluster,
    RedisInstance,
    read_only_dir,
    small_tmpfs,
)

T = TypeVar("T")


def _unavailable(message: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def _need(binary: str) -> None:
    if shutil.which(binary) is None and not Path(binary).exists():
        _unavailable(f"{binary} is not installed")


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")


def wait_for(condition: Callable[[], T | None], timeout: float, what: str) -> T:
    give_up = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > give_up:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)  # polling a condition, bounded above


def _in_thread(work: Callable[[], T]) -> tuple[threading.Thread, list[T | BaseException]]:
    """Run ``work`` in a daemon thread; its result (or exception) lands in the list."""
    result: list[T | BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _proc_state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2]


# -- PostgreSQL ----------------------------------------------------------------------------
@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[PostgresCluster]:
    _need(str(PG_BIN / "postgres"))
    cluster = PostgresCluster(tmp_path, settings={"default_transaction_isolation": "serializable"})
    yield cluster
    cluster.close()


def _count(url: str) -> int:
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("SELECT count(*) FROM t").fetchone()
    assert row is not None
    return int(row[0])


def test_postgres_restarts_lose_no_committed_row(postgres: PostgresCluster) -> None:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        settings = conn.execute(
            "SELECT current_setting('fsync'), current_setting('default_transaction_isolation')"
        ).fetchone()
        assert settings == ("on", "serializable")
        conn.execute("CREATE TABLE t (n int)")
        for n in range(20):
            conn.execute("INSERT INTO t VALUES (%s)", (n,))
    postgres.restart("immediate")  # pg_ctl stop -m immediate: no checkpoint, crash recovery
    assert _count(postgres.url) == 20

    pending = psycopg.connect(postgres.url)
    pending.execute("INSERT INTO t VALUES (-1)")  # never committed
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("INSERT INTO t SELECT generate_series(20, 39)")
    postgres.kill9()  # the postmaster and every backend at once
    assert not postgres.running
    postgres.start()
    assert _count(postgres.url) == 40
    pending.close()


def test_postgres_pause_stops_every_process_until_resumed(postgres: PostgresCluster) -> None:
    conn = psycopg.connect(postgres.url, autocommit=True)
    backend_pid = conn.info.backend_pid
    postgres.pause()
    assert _proc_state(postgres.pid) == "T"
    assert _proc_state(backend_pid) == "T"  # the backends too, not only the postmaster

    with pytest.raises(psycopg.OperationalError):  # a new connection times out
        psycopg.connect(postgres.url, connect_timeout=1)
    thread, result = _in_thread(lambda: conn.execute("SELECT 42").fetchone())
    thread.join(0.5)
    assert thread.is_alive(), "a query answered while the server was paused"

    postgres.resume()
    thread.join(30)
    assert result == [(42,)]
    conn.close()


# -- MariaDB -------------------------------------------------------------------------------
@pytest.fixture
def mariadb(tmp_path: Path) -> Iterator[MariaDbInstance]:
    _need("mariadbd")
    instance = MariaDbInstance(tmp_path)
    yield instance
    instance.close()


def _mariadb(
    instance: MariaDbInstance, read_timeout: float | None = None
) -> pymysql.Connection[pymysql.cursors.Cursor]:
    return pymysql.connect(
        host="127.0.0.1",
        port=instance.port,
        user="root",
        database="test",
        read_timeout=read_timeout,
    )


def test_mariadb_kill9_keeps_committed_rows_only(mariadb: MariaDbInstance) -> None:
    assert mariadb.url == f"mysql://root@127.0.0.1:{mariadb.port}/test"
    conn = _mariadb(mariadb)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (n INT) ENGINE=InnoDB")
        cur.execute("INSERT INTO t VALUES (1), (2)")
    conn.commit()
    with conn.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (3)")  # open transaction at the crash
    mariadb.kill9()
    mariadb.start()
    with _mariadb(mariadb) as again, again.cursor() as cur:
        cur.execute("SELECT n FROM t ORDER BY n")
        assert cur.fetchall() == ((1,), (2,))
    conn.close()


def test_mariadb_pause_times_a_query_out_until_resumed(mariadb: MariaDbInstance) -> None:
    conn = _mariadb(mariadb, read_timeout=1)
    mariadb.pause()
    with pytest.raises(pymysql.err.OperationalError), conn.cursor() as cur:
        cur.execute("SELECT 1")
    mariadb.resume()
    with _mariadb(mariadb, read_timeout=30) as again, again.cursor() as cur:
        cur.execute("SELECT 2")
        assert cur.fetchone() == (2,)


# -- Redis ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("persistence", "restart", "kept"),
    [
        ("none", "nosave", False),
        ("aof", "nosave", True),
        ("aof", "kill9", True),  # appendfsync always
        ("rdb", "save", True),
        ("rdb", "kill9", False),
    ],
)
def test_redis_restart_keeps_what_its_persistence_promises(
    tmp_path: Path, persistence: str, restart: str, kept: bool
) -> None:
    _need("redis-server")
    with RedisInstance(tmp_path, persistence=persistence) as server:  # type: ignore[arg-type]
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        client.set("fence:job", 7)
        server.restart(restart)  # type: ignore[arg-type]
        assert (client.get("fence:job") == b"7") is kept
        client.close()


def test_redis_shutdown_nosave_then_pause_and_resume(tmp_path: Path) -> None:
    _need("redis-server")
    with RedisInstance(tmp_path) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=0.5)
        client.set("k", 1)
        server.shutdown_nosave()
        assert not server.running
        server.start()
        assert client.get("k") is None
        server.pause()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        server.resume()
        assert wait_for(lambda: _pings(server.url), 30, "redis to answer after SIGCONT")
        client.close()


def _pings(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_timeout=5) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


# -- the proxy -----------------------------------------------------------------------------
class EchoServer:
    """Echoes every byte back; counts connections and records what it received."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.accepted = 0
        self.received = bytearray()
        self.errors: list[OSError] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    self.received += data
                    conn.sendall(data)
            except OSError as exc:
                self.errors.append(exc)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", echo.port), seed=1) as fault_proxy:
        yield fault_proxy


def _client(proxy: FaultProxy, timeout: float = 10) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    conn.settimeout(timeout)
    return conn


def _round_trip(conn: socket.socket, payload: bytes) -> float:
    started = time.monotonic()
    conn.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = conn.recv(65536)
        assert chunk, "the proxy closed the connection"
        got += chunk
    assert got == payload
    return time.monotonic() - started


def test_proxy_delay_adds_the_delay_per_direction(proxy: FaultProxy) -> None:
    conn = _client(proxy)
    assert _round_trip(conn, b"ping") < 2
    proxy.delay(0.3)
    assert 0.6 <= _round_trip(conn, b"both ways") < 5  # applies to an open connection
    proxy.delay(0.3, direction="to_client")
    assert 0.3 <= _round_trip(conn, b"one way") < 4.7
    proxy.delay(0.2, jitter=0.1)
    assert 0.2 <= _round_trip(_client(proxy), b"new connection") < 4.6
    proxy.pass_()
    assert _round_trip(conn, b"pong") < 2
    conn.close()


def test_proxy_blackhole_holds_bytes_and_connections(proxy: FaultProxy, echo: EchoServer) -> None:
    conn = _client(proxy, timeout=0.5)
    _round_trip(conn, b"warm")
    proxy.blackhole()
    conn.sendall(b"held")
    with pytest.raises(TimeoutError):  # no answer, and no EOF either: the socket stays open
        conn.recv(16)
    late = _client(proxy, timeout=0.5)  # accepted, but the target sees nothing yet
    late.sendall(b"late")
    wait_for(lambda: proxy.connections == 2, 10, "the proxy to accept the new connection")
    assert echo.accepted == 1
    assert bytes(echo.received) == b"warm"

    proxy.pass_()  # the held bytes are delivered, as after a healed partition
    conn.settimeout(10)
    late.settimeout(10)
    assert conn.recv(16) == b"held"
    assert late.recv(16) == b"late"
    assert echo.accepted == 2
    conn.close()
    late.close()


def test_proxy_blackhole_of_the_answers_only(proxy: FaultProxy, echo: EchoServer) -> None:
    conn = _client(proxy, timeout=0.5)
    proxy.blackhole(direction="to_client")
    conn.sendall(b"request")
    wait_for(lambda: bytes(echo.received) == b"request", 10, "the request to reach the server")
    wait_for(lambda: proxy.pending("to_client") == len(b"request"), 10, "the answer to be held")
    assert proxy.pending("to_server") == 0
    with pytest.raises(TimeoutError):
        conn.recv(16)
    proxy.pass_()
    conn.settimeout(10)
    assert conn.recv(16) == b"request"
    conn.close()


def test_proxy_reset_raises_a_connection_error_on_both_sides(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    conn = _client(proxy)
    _round_trip(conn, b"hello")
    assert proxy.reset() == 1
    with pytest.raises(ConnectionResetError):
        conn.recv(16)
    wait_for(lambda: echo.errors, 10, "the server side to see the reset")
    assert isinstance(echo.errors[0], ConnectionResetError)
    assert proxy.connections == 0
    again = _client(proxy)  # the mode is unchanged: new connections pass
    assert _round_trip(again, b"again") < 5
    again.close()
    conn.close()


def test_proxy_reset_mid_call_reaches_a_real_client_as_a_connection_error(
    tmp_path: Path,
) -> None:
    _need("redis-server")
    with (
        RedisInstance(tmp_path) as server,
        FaultProxy(("127.0.0.1", server.port)) as fault_proxy,
    ):
        # redis-py replaces a pooled connection that died *between* commands unseen, and
        # retries on a new one by default: reset while the answer is in flight, no retry.
        client = redis.Redis(port=fault_proxy.port, socket_timeout=10, retry=Retry(NoBackoff(), 0))
        direct = redis.Redis.from_url(server.url, socket_timeout=10)
        client.set("k", "v")
        fault_proxy.blackhole(direction="to_client")
        thread, result = _in_thread(lambda: client.get("k"))
        wait_for(
            lambda: direct.info("commandstats").get("cmdstat_get", {}).get("calls") == 1,
            10,
            "the GET to reach the server (its answer is held)",
        )
        fault_proxy.reset()
        thread.join(10)
        assert len(result) == 1
        assert isinstance(result[0], redis.ConnectionError), result
        client.close()
        direct.close()


def test_proxy_half_close_ends_what_the_client_reads_only(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    conn = _client(proxy)
    _round_trip(conn, b"one")
    proxy.half_close()
    assert conn.recv(16) == b""  # EOF: the server→client direction is shut
    conn.sendall(b"two")  # client→server still flows
    wait_for(lambda: bytes(echo.received) == b"onetwo", 10, "client bytes after the half-close")
    late = _client(proxy)
    assert late.recv(16) == b""  # new connections are half-closed too
    proxy.pass_()
    fresh = _client(proxy)
    assert _round_trip(fresh, b"three") < 5
    for sock in (conn, late, fresh):
        sock.close()


def test_proxy_bandwidth_paces_the_bytes(proxy: FaultProxy) -> None:
    conn = _client(proxy)
    payload = os.urandom(100_000)
    assert _round_trip(conn, payload) < 2
    proxy.bandwidth(200_000)  # 10 kB every 50 ms each way: >= 0.45 s for 100 kB
    assert 0.45 <= _round_trip(conn, payload) < 10
    conn.close()


def test_proxy_close_joins_its_thread(echo: EchoServer) -> None:
    fault_proxy = FaultProxy(("127.0.0.1", echo.port))
    conn = _client(fault_proxy)
    _round_trip(conn, b"x")
    fault_proxy.blackhole()
    conn.sendall(b"held at close")
    fault_proxy.close()
    assert not any(t.name.startswith("FaultProxy") for t in threading.enumerate())
    assert conn.recv(64) == b""  # closed, not left hanging
    conn.close()
    fault_proxy.close()  # idempotent


# -- clocks --------------------------------------------------------------------------------
_PROBE = """
import sys, time
time.sleep(0.01)  # Python >= 3.11 sleeps with clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)
print(time.time() - time.monotonic(), time.monotonic(), flush=True)
"""


def _real_offset() -> float:
    return time.time() - time.monotonic()


@pytest.mark.parametrize("offset_s", [600.0, -600.0, 2.5])
def test_faketime_env_shifts_time_time_only(offset_s: float) -> None:
    try:
        env = {**os.environ, **faketime_env(offset_s)}
    except FaketimeUnavailable as exc:
        _unavailable(str(exc))
    before = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    after = time.monotonic()
    assert done.returncode == 0, done.stderr
    wall_minus_mono, mono = map(float, done.stdout.split())
    assert abs(wall_minus_mono - _real_offset() - offset_s) < 0.5
    assert before <= mono <= after  # CLOCK_MONOTONIC is the real, system-wide one


def test_faketime_spec() -> None:
    assert faketime_spec(600) == "+600s"
    assert faketime_spec(-1.5) == "-1.5s"
    assert faketime_spec(0) == "+0s"


def test_steppable_clock_steps_a_running_child() -> None:
    try:
        clock = SteppableClock(0.0)
    except FaketimeUnavailable as exc:
        _unavailable(str(exc))
    loop = (
        "import time\n"
        "while True:\n"
        "    print(time.time() - time.monotonic(), time.monotonic(), flush=True)\n"
        "    time.sleep(0.001)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", loop],
        env={**os.environ, **clock.env},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        stdout = child.stdout

        def sample() -> tuple[float, float]:
            wall_minus_mono, mono = map(float, stdout.readline().split())
            return wall_minus_mono - _real_offset(), mono

        assert abs(sample()[0]) < 0.5
        for target in (300.0, -45.0, 0.0):
            stepped_at = time.monotonic()
            clock.set(target)
            give_up = stepped_at + 30
            while True:  # the child prints every millisecond: read until the step shows
                offset, mono = sample()
                if abs(offset - target) < 0.5:
                    break
                assert mono < give_up, f"the child never saw the step to {target}"
            assert mono - stepped_at < 1.0, f"the step took {mono - stepped_at:.3f} s to apply"
    finally:
        child.kill()
        child.wait(30)
        clock.close()


def test_a_server_under_a_steppable_clock(tmp_path: Path) -> None:
    _need("redis-server")
    try:
        clock = SteppableClock(0.0)
    except FaketimeUnavailable as exc:
        _unavailable(str(exc))
    # redis-server links jemalloc, which deadlocks with a plain libfaketime preload.
    with RedisInstance(tmp_path, env=clock.env) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        client.set("lease", "a", px=5_000)
        clock.step(10)  # the store's clock jumps past the expiry
        seconds, micros = client.time()
        assert abs(seconds + micros / 1e6 - time.time() - 10) < 1
        assert client.get("lease") is None
        client.close()
    clock.close()


# -- filesystems for SQLite ----------------------------------------------------------------
def test_small_tmpfs_fills_up() -> None:
    _need_root()
    with small_tmpfs(256 * 1024) as directory:
        assert os.path.ismount(directory)
        database = sqlite3.connect(directory / "store.db")
        database.execute("CREATE TABLE t (b BLOB)")
        with pytest.raises(sqlite3.OperationalError, match="full"):
            for _ in range(100):
                database.execute("INSERT INTO t VALUES (randomblob(16384))")
                database.commit()
        database.close()
        with (
            pytest.raises(OSError, match="No space") as raised,
            (directory / "more").open("wb") as more,
        ):
            more.write(os.urandom(512 * 1024))
            more.flush()
        assert raised.value.errno == errno.ENOSPC
    assert not directory.exists()


def test_read_only_dir_refuses_writes(tmp_path: Path) -> None:
    _need_root()
    directory = tmp_path / "store"
    directory.mkdir()
    database = sqlite3.connect(directory / "store.db")
    database.execute("CREATE TABLE t (n INT)")
    database.commit()
    database.close()
    with read_only_dir(directory):
        with pytest.raises(OSError, match="Read-only") as raised:
            (directory / "new").write_text("x")
        assert raised.value.errno == errno.EROFS
        with pytest.raises(OSError, match="Read-only"):
            (directory / "store.db").open("ab")
        reader = sqlite3.connect(directory / "store.db")
        assert reader.execute("SELECT count(*) FROM t").fetchone() == (0,)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.execute("INSERT INTO t VALUES (1)")
        reader.close()
    assert not os.path.ismount(directory)
    (directory / "new").write_text("writable again")
