"""Uncontended lock cycle (acquire + release): fleetcron beside raw floors and peer libraries.

Run from the project root::

    .venv/bin/python bench/locks.py                 # full run, about 2-3 minutes
    .venv/bin/python bench/locks.py --cycles 400 --rounds 8 --only redis   # smoke run

Method (after research/perf_baseline.md): every subject gets ``--warmup`` untimed cycles,
then ``--cycles`` timed cycles split over ``--rounds`` rounds. Each round visits the subjects
in a freshly shuffled order; before each timed chunk the subject runs ``--pre`` untimed
cycles (the first call after switching subjects is slow on a small VM); GC is disabled
inside a chunk and collected between chunks. Round trips per cycle are counted in a separate,
untimed pass through a counting TCP relay on 127.0.0.1 (a round trip = one burst of
client-to-server bytes answered by the server). Every subject talks to 127.0.0.1 only.

Results: a markdown table on stdout and ``bench/results/locks.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import random
import secrets
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
PORTS = {"postgres": 5432, "mysql": 3306, "redis": 6379}
PG_USER, PG_DB = "postgres", "test"
MYSQL_USER, MYSQL_DB = "root", "test"
REDIS_DB = 0
LEASE_S = 30
BACKENDS = ("sqlite", "postgres", "mysql", "redis")
KIND_ORDER = {"fleetcron": 0, "floor": 1, "peer": 2, "ref": 3}
RESULTS = Path(__file__).resolve().parent / "results" / "locks.json"
PACKAGES = (
    "fleetcron",
    "redis",
    "hiredis",
    "psycopg",
    "psycopg-binary",
    "psycopg2-binary",
    "PyMySQL",
    "python-redis-lock",
    "pottery",
    "tooz",
)


class BenchError(RuntimeError):
    """A cycle did not do what a lock cycle must (acquire and release both succeed)."""


@dataclass
class Runner:
    """A built subject: ``cycle()`` does one acquire + release, ``close()`` frees it."""

    cycle: Callable[[], None]
    close: Callable[[], None]


@dataclass
class Subject:
    key: str
    backend: str
    kind: str  # fleetcron | floor | peer | ref
    label: str
    build: Callable[[int], Runner]  # port (the real one, or the relay's) -> Runner
    floor: str | None = None  # key of the matching floor, for the ratio
    # filled in by the run
    status: str = "pending"
    reason: str = ""
    latencies_ns: list[int] = field(default_factory=list)
    chunk_p50_ns: dict[int, float] = field(default_factory=dict)  # round -> chunk median
    cpu_ns: int = 0
    rt: dict[str, float] = field(default_factory=dict)


# -- subjects ----------------------------------------------------------------------------


def _lock_name(key: str) -> str:
    return f"bench-{key}-{os.getpid()}"


def _check(ok: object, what: str) -> None:
    if not ok:
        raise BenchError(what)


def fleetcron_runner(url: str, key: str) -> Runner:
    from fleetcron import Fleet

    fleet = Fleet(url, namespace="bench")
    name = _lock_name(key)

    def cycle() -> None:
        lease = fleet.try_lock(name, lock_at_most="30s", keepalive=False)
        if lease is None:
            raise BenchError("fleetcron try_lock returned None (lease held)")
        _check(lease.release(), "fleetcron release returned False")

    return Runner(cycle, fleet.close)


def sqlite_path(tmp: Path, name: str) -> Path:
    return tmp / f"{name}.db"


def fleetcron_sqlite(tmp: Path) -> Callable[[int], Runner]:
    return lambda _port: fleetcron_runner(f"sqlite:///{sqlite_path(tmp, 'fleetcron')}", "sqlite")


def fleetcron_postgres(port: int) -> Runner:
    return fleetcron_runner(f"postgresql://{PG_USER}@{HOST}:{port}/{PG_DB}", "postgres")


def fleetcron_mysql(port: int) -> Runner:
    return fleetcron_runner(f"mysql://{MYSQL_USER}@{HOST}:{port}/{MYSQL_DB}", "mysql")


def fleetcron_redis(port: int) -> Runner:
    return fleetcron_runner(f"redis://{HOST}:{port}/{REDIS_DB}", "redis")


# floors: the minimal correct lock a user could hand-write on each backend

SQLITE_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


def floor_sqlite(tmp: Path) -> Callable[[int], Runner]:
    def build(_port: int) -> Runner:
        conn = sqlite3.connect(
            sqlite_path(tmp, "floor"), isolation_level=None, timeout=30, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_lock (name TEXT PRIMARY KEY,"
            " lock_until INTEGER NOT NULL, locked_by TEXT NOT NULL)"
        )
        name = _lock_name("floor-sqlite")
        conn.execute("INSERT OR IGNORE INTO bench_lock VALUES (?, 0, '')", (name,))
        acquire = (
            f"UPDATE bench_lock SET lock_until = {SQLITE_NOW_MS} + :ms, locked_by = :by"
            f" WHERE name = :name AND lock_until <= {SQLITE_NOW_MS}"
        )
        release = (
            f"UPDATE bench_lock SET lock_until = {SQLITE_NOW_MS}"
            " WHERE name = :name AND locked_by = :by"
        )

        def locked_update(sql: str, params: dict[str, object]) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                count = conn.execute(sql, params).rowcount
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return count

        def cycle() -> None:
            token = secrets.token_hex(10)
            params = {"name": name, "by": token, "ms": LEASE_S * 1000}
            _check(locked_update(acquire, params) == 1, "sqlite floor: acquire failed")
            _check(locked_update(release, params) == 1, "sqlite floor: release failed")

        return Runner(cycle, conn.close)

    return build


def floor_postgres(port: int) -> Runner:
    import psycopg

    conn = psycopg.connect(host=HOST, port=port, user=PG_USER, dbname=PG_DB, autocommit=True)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS bench_shedlock (name text PRIMARY KEY,"
        " lock_until timestamptz NOT NULL, locked_at timestamptz NOT NULL,"
        " locked_by text NOT NULL)"
    )
    name = _lock_name("floor-postgres")
    conn.execute(
        "INSERT INTO bench_shedlock VALUES (%s, '-infinity', '-infinity', '')"
        " ON CONFLICT (name) DO UPDATE SET lock_until = '-infinity'",
        (name,),
    )
    cur = conn.cursor()
    acquire = (
        "UPDATE bench_shedlock SET lock_until = now() + interval '30 seconds',"
        " locked_at = now(), locked_by = %s WHERE name = %s AND lock_until <= now()"
    )
    release = "UPDATE bench_shedlock SET lock_until = now() WHERE name = %s AND locked_by = %s"

    def cycle() -> None:
        token = secrets.token_hex(10)
        cur.execute(acquire, (token, name))
        _check(cur.rowcount == 1, "postgres floor: acquire failed")
        cur.execute(release, (name, token))
        _check(cur.rowcount == 1, "postgres floor: release failed")

    return Runner(cycle, conn.close)


def floor_mysql(port: int) -> Runner:
    import pymysql

    conn = pymysql.connect(
        host=HOST, port=port, user=MYSQL_USER, database=MYSQL_DB, autocommit=True
    )
    cur = conn.cursor()
    cur.execute(
        "CREATE TABLE IF NOT EXISTS bench_shedlock (name VARCHAR(64) PRIMARY KEY,"
        " lock_until DATETIME(6) NOT NULL, locked_at DATETIME(6) NOT NULL,"
        " locked_by VARCHAR(255) NOT NULL) ENGINE=InnoDB"
    )
    name = _lock_name("floor-mysql")
    cur.execute(
        "INSERT INTO bench_shedlock VALUES (%s, '1970-01-01', '1970-01-01', '')"
        " ON DUPLICATE KEY UPDATE lock_until = '1970-01-01'",
        (name,),
    )
    acquire = (
        "UPDATE bench_shedlock SET lock_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND,"
        " locked_at = UTC_TIMESTAMP(6), locked_by = %s"
        " WHERE name = %s AND lock_until <= UTC_TIMESTAMP(6)"
    )
    release = (
        "UPDATE bench_shedlock SET lock_until = UTC_TIMESTAMP(6) WHERE name = %s AND locked_by = %s"
    )

    def cycle() -> None:
        token = secrets.token_hex(10)
        _check(cur.execute(acquire, (token, name)) == 1, "mysql floor: acquire failed")
        _check(cur.execute(release, (name, token)) == 1, "mysql floor: release failed")

    return Runner(cycle, conn.close)


CAD = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def _redis(port: int) -> Any:
    import redis

    return redis.Redis(host=HOST, port=port, db=REDIS_DB)


def floor_redis(port: int) -> Runner:
    r = _redis(port)
    cad = r.register_script(CAD)
    name = _lock_name("floor-redis")
    r.delete(name)

    def cycle() -> None:
        token = secrets.token_hex(10)
        _check(r.set(name, token, nx=True, px=LEASE_S * 1000), "redis floor: SET NX failed")
        _check(cad(keys=[name], args=[token]) == 1, "redis floor: compare-and-delete failed")

    return Runner(cycle, r.close)


# peers


def peer_redis_py(port: int) -> Runner:
    r = _redis(port)
    lock = r.lock(_lock_name("redis-py"), timeout=LEASE_S)

    def cycle() -> None:
        _check(lock.acquire(blocking=False), "redis-py Lock: acquire failed")
        lock.release()

    return Runner(cycle, r.close)


def peer_python_redis_lock(port: int) -> Runner:
    import redis_lock

    r = _redis(port)
    lock = redis_lock.Lock(r, _lock_name("python-redis-lock"), expire=LEASE_S, auto_renewal=False)

    def cycle() -> None:
        _check(lock.acquire(blocking=False), "python-redis-lock: acquire failed")
        lock.release()

    return Runner(cycle, r.close)


def peer_pottery(port: int) -> Runner:
    from pottery import Redlock

    r = _redis(port)
    lock = Redlock(key=_lock_name("pottery"), masters={r}, auto_release_time=LEASE_S)

    def cycle() -> None:
        _check(lock.acquire(blocking=False), "pottery Redlock: acquire failed")
        lock.release()

    return Runner(cycle, r.close)


def _tooz(url: str, key: str) -> Runner:
    from tooz import coordination

    coordinator = coordination.get_coordinator(url, f"bench-{key}-{os.getpid()}".encode())
    coordinator.start()
    lock = coordinator.get_lock(_lock_name(key).encode())

    def cycle() -> None:
        _check(lock.acquire(blocking=False), f"{key}: acquire failed")
        _check(lock.release() is not False, f"{key}: release failed")

    return Runner(cycle, coordinator.stop)


def peer_tooz_redis(port: int) -> Runner:
    return _tooz(f"redis://{HOST}:{port}?db={REDIS_DB}", "tooz-redis")


def peer_tooz_postgres(port: int) -> Runner:
    return _tooz(f"postgresql://{PG_USER}@{HOST}:{port}/{PG_DB}", "tooz-postgres")


def peer_tooz_mysql(port: int) -> Runner:
    return _tooz(f"mysql://{MYSQL_USER}@{HOST}:{port}/{MYSQL_DB}", "tooz-mysql")


# one-round-trip references (context only: what one request costs with the same client)


def ref_redis(port: int) -> Runner:
    r = _redis(port)
    return Runner(lambda: _check(r.ping(), "PING failed"), r.close)


def ref_postgres(port: int) -> Runner:
    import psycopg

    conn = psycopg.connect(host=HOST, port=port, user=PG_USER, dbname=PG_DB, autocommit=True)
    cur = conn.cursor()

    def cycle() -> None:
        cur.execute("SELECT 1")
        _check(cur.fetchone() == (1,), "SELECT 1 failed")

    return Runner(cycle, conn.close)


def ref_mysql(port: int) -> Runner:
    import pymysql

    conn = pymysql.connect(
        host=HOST, port=port, user=MYSQL_USER, database=MYSQL_DB, autocommit=True
    )
    cur = conn.cursor()

    def cycle() -> None:
        cur.execute("SELECT 1")
        _check(cur.fetchone() == (1,), "SELECT 1 failed")

    return Runner(cycle, conn.close)


def make_subjects(tmp: Path) -> list[Subject]:
    s = Subject
    return [
        s("fleetcron-sqlite", "sqlite", "fleetcron", "fleetcron (sqlite, synchronous=FULL)",
          fleetcron_sqlite(tmp), "floor-sqlite"),
        s("floor-sqlite", "sqlite", "floor",
          "floor: WAL, BEGIN IMMEDIATE cond. UPDATE + release (synchronous=FULL)",
          floor_sqlite(tmp)),
        s("fleetcron-postgres", "postgres", "fleetcron", "fleetcron (postgresql)",
          fleetcron_postgres, "floor-postgres"),
        s("floor-postgres", "postgres", "floor",
          "floor: ShedLock-style UPDATE acquire + UPDATE release (psycopg 3, autocommit)",
          floor_postgres),
        s("tooz-postgres", "postgres", "peer", "tooz postgresql (get_lock)",
          peer_tooz_postgres, "floor-postgres"),
        s("ref-postgres", "postgres", "ref", "ref: SELECT 1 (psycopg 3), one round trip",
          ref_postgres),
        s("fleetcron-mysql", "mysql", "fleetcron", "fleetcron (mysql/mariadb)",
          fleetcron_mysql, "floor-mysql"),
        s("floor-mysql", "mysql", "floor",
          "floor: ShedLock-style UPDATE acquire + UPDATE release (PyMySQL, autocommit)",
          floor_mysql),
        s("tooz-mysql", "mysql", "peer", "tooz mysql (get_lock; extra, not in the brief)",
          peer_tooz_mysql, "floor-mysql"),
        s("ref-mysql", "mysql", "ref", "ref: SELECT 1 (PyMySQL), one round trip", ref_mysql),
        s("fleetcron-redis", "redis", "fleetcron", "fleetcron (redis)",
          fleetcron_redis, "floor-redis"),
        s("floor-redis", "redis", "floor",
          "floor: SET NX PX + Lua compare-and-delete (redis-py)", floor_redis),
        s("redis-py", "redis", "peer", "redis-py Lock", peer_redis_py, "floor-redis"),
        s("python-redis-lock", "redis", "peer", "python-redis-lock (auto_renewal=False)",
          peer_python_redis_lock, "floor-redis"),
        s("pottery", "redis", "peer", "pottery Redlock (1 master)", peer_pottery,
          "floor-redis"),
        s("tooz-redis", "redis", "peer", "tooz redis (get_lock)", peer_tooz_redis,
          "floor-redis"),
        s("ref-redis", "redis", "ref", "ref: PING (redis-py), one round trip", ref_redis),
    ]  # fmt: skip


# -- counting relay ----------------------------------------------------------------------


class CountingRelay:
    """A TCP relay on 127.0.0.1 that counts client-to-server request bursts.

    A burst starts when the client sends after the server last spoke on that connection
    (or for the first time); a request the server answers therefore counts once however
    many segments it takes, and pipelined commands sent together count once.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._lock = threading.Lock()
        self.bursts = self.connections = self.up_bytes = self.down_bytes = 0
        self._listener = socket.create_server((HOST, 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def reset(self) -> None:
        with self._lock:
            self.bursts = self.connections = self.up_bytes = self.down_bytes = 0

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "bursts": self.bursts,
                "connections": self.connections,
                "up_bytes": self.up_bytes,
                "down_bytes": self.down_bytes,
            }

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection((HOST, self.target_port))
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                self._sockets += [client, server]
            state = {"last": ""}
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, up, state), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, up: bool, state: dict[str, str]
    ) -> None:
        direction = "up" if up else "down"
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self._lock:
                    if up:
                        if state["last"] != "up":
                            self.bursts += 1
                        self.up_bytes += len(data)
                    else:
                        self.down_bytes += len(data)
                    state["last"] = direction
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()


def count_round_trips(subject: Subject, cycles: int) -> dict[str, float]:
    if subject.backend == "sqlite":
        return {"rt_per_cycle": 0.0, "conns_per_cycle": 0.0, "up_bytes": 0.0, "down_bytes": 0.0}
    relay = CountingRelay(PORTS[subject.backend])
    runner = subject.build(relay.port)
    try:
        for _ in range(10):
            runner.cycle()
        time.sleep(0.05)
        relay.reset()
        for _ in range(cycles):
            runner.cycle()
        time.sleep(0.1)  # let trailing fire-and-forget bytes (e.g. a Terminate) be counted
        seen = relay.snapshot()
    finally:
        runner.close()
        relay.close()
    return {
        "rt_per_cycle": seen["bursts"] / cycles,
        "conns_per_cycle": seen["connections"] / cycles,
        "up_bytes": seen["up_bytes"] / cycles,
        "down_bytes": seen["down_bytes"] / cycles,
    }


# -- timing ------------------------------------------------------------------------------


def time_chunk(runner: Runner, cycles: int, pre: int) -> tuple[list[int], int]:
    for _ in range(pre):
        runner.cycle()
    gc.collect()
    gc.disable()
    out: list[int] = []
    clock = time.perf_counter_ns
    cycle = runner.cycle
    try:
        cpu0 = time.process_time_ns()
        for _ in range(cycles):
            t0 = clock()
            cycle()
            out.append(clock() - t0)
        cpu = time.process_time_ns() - cpu0
    finally:
        gc.enable()
    return out, cpu


def percentile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[index])


def fail(subject: Subject, runners: dict[str, Runner], exc: BaseException, when: str) -> None:
    subject.status = "failed"
    subject.reason = f"{when}: {type(exc).__name__}: {exc}".splitlines()[0][:300]
    runner = runners.pop(subject.key, None)
    if runner is not None:
        with contextlib.suppress(Exception):
            runner.close()
    print(f"  ! {subject.key} not measured ({subject.reason})", file=sys.stderr)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-bench-"))
    subjects = make_subjects(tmp)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        subjects = [s for s in subjects if any(w in s.key for w in wanted)]
    rng = random.Random(args.seed)
    chunk = max(1, args.cycles // args.rounds)
    runners: dict[str, Runner] = {}
    started = time.time()
    try:
        print(f"setting up {len(subjects)} subjects ...", file=sys.stderr)
        for subject in subjects:
            try:
                runners[subject.key] = subject.build(PORTS.get(subject.backend, 0))
                for _ in range(args.warmup):
                    runners[subject.key].cycle()
                subject.status = "measured"
            except Exception as exc:
                fail(subject, runners, exc, "setup/warm-up")

        for round_no in range(args.rounds):
            order = [s for s in subjects if s.key in runners]
            rng.shuffle(order)
            for subject in order:
                try:
                    lat, cpu = time_chunk(runners[subject.key], chunk, args.pre)
                except Exception as exc:
                    fail(subject, runners, exc, f"round {round_no}")
                    continue
                subject.latencies_ns += lat
                subject.cpu_ns += cpu
                subject.chunk_p50_ns[round_no] = statistics.median(lat)
            print(f"  round {round_no + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for runner in runners.values():
            with contextlib.suppress(Exception):
                runner.close()
    timed_s = time.time() - started

    print("counting round trips through the relay ...", file=sys.stderr)
    for subject in subjects:
        if subject.status != "measured":
            continue
        try:
            subject.rt = count_round_trips(subject, args.rt_cycles)
        except Exception as exc:
            subject.rt = {}
            print(f"  ! round-trip pass failed for {subject.key}: {exc}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    return summarise(subjects, args, started, timed_s)


# -- reporting ---------------------------------------------------------------------------


def summarise(
    subjects: list[Subject], args: argparse.Namespace, started: float, timed_s: float
) -> dict[str, Any]:
    by_key = {s.key: s for s in subjects}
    rows: list[dict[str, Any]] = []
    for s in subjects:
        row: dict[str, Any] = {
            "key": s.key,
            "backend": s.backend,
            "kind": s.kind,
            "label": s.label,
            "floor": s.floor,
            "status": s.status,
            "reason": s.reason or None,
        }
        if s.status == "measured" and s.latencies_ns:
            lat = sorted(s.latencies_ns)
            mean_ns = statistics.fmean(lat)
            chunk = list(s.chunk_p50_ns.values())
            row |= {
                "n": len(lat),
                "p50_us": percentile(lat, 50) / 1e3,
                "p99_us": percentile(lat, 99) / 1e3,
                "mean_us": mean_ns / 1e3,
                "ops_s": 1e9 / mean_ns,
                "client_cpu_us": s.cpu_ns / len(lat) / 1e3,
                "round_p50_min_us": min(chunk) / 1e3,
                "round_p50_max_us": max(chunk) / 1e3,
            }
            row |= s.rt
        rows.append(row)
    for row in rows:
        floor = by_key.get(row["floor"] or "")
        if "p50_us" not in row or floor is None or floor.status != "measured":
            continue
        floor_row = next(r for r in rows if r["key"] == floor.key)
        row["ratio_p50"] = row["p50_us"] / floor_row["p50_us"]
        subject = by_key[row["key"]]
        paired = [
            p50 / floor.chunk_p50_ns[r]
            for r, p50 in subject.chunk_p50_ns.items()
            if r in floor.chunk_p50_ns
        ]
        row["ratio_paired_median"] = statistics.median(paired) if paired else None
    return {
        "meta": meta(args, started, timed_s),
        "subjects": rows,
        "targets": targets(rows),
    }


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in BACKENDS:
        fc = next((r for r in rows if r["backend"] == backend and r["kind"] == "fleetcron"), None)
        if fc is None or "p50_us" not in fc:
            continue
        peers = [r for r in rows if r["backend"] == backend and r["kind"] == "peer"]
        slower_peers = [p["key"] for p in peers if "p50_us" in p and p["p50_us"] <= fc["p50_us"]]
        result: dict[str, Any] = {
            "ratio_p50": fc.get("ratio_p50"),
            "ratio_ok": fc.get("ratio_p50") is not None and fc["ratio_p50"] <= 1.1,
            "peers_measured": [p["key"] for p in peers if "p50_us" in p],
            "peers_not_measured": [p["key"] for p in peers if "p50_us" not in p],
            "peers_at_least_as_fast": slower_peers,
            "faster_than_every_measured_peer": not slower_peers,
        }
        if backend != "sqlite":
            rt = fc.get("rt_per_cycle")
            result["rt_per_cycle"] = rt
            result["rt_ok"] = rt is not None and rt <= 2.0
        out[backend] = result
    return out


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def server_versions() -> dict[str, str]:
    found: dict[str, str] = {"sqlite": sqlite3.sqlite_version}
    with contextlib.suppress(Exception):
        import psycopg

        with psycopg.connect(host=HOST, port=PORTS["postgres"], user=PG_USER, dbname=PG_DB) as c:
            row = c.execute(
                "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
                " current_setting('fsync'), current_setting('wal_sync_method')"
            ).fetchone()
            assert row is not None
            found["postgres"] = (
                f"{row[0]} (synchronous_commit={row[1]}, fsync={row[2]}, wal_sync_method={row[3]})"
            )
    with contextlib.suppress(Exception):
        import pymysql

        conn = pymysql.connect(host=HOST, port=PORTS["mysql"], user=MYSQL_USER)
        with conn.cursor() as cur:
            cur.execute("SELECT version(), @@innodb_flush_log_at_trx_commit, @@log_bin")
            v = cur.fetchone()
        conn.close()
        assert v is not None
        found["mysql"] = f"{v[0]} (innodb_flush_log_at_trx_commit={v[1]}, log_bin={v[2]})"
    with contextlib.suppress(Exception):
        import redis

        r = redis.Redis(host=HOST, port=PORTS["redis"], db=REDIS_DB)
        info = r.info("server")
        persistence = r.info("persistence")
        found["redis"] = f"{info['redis_version']} (aof_enabled={persistence['aof_enabled']})"
        r.close()
    return found


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def meta(args: argparse.Namespace, started: float, timed_s: float) -> dict[str, Any]:
    return {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "timed_phase_s": round(timed_s, 1),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "packages": {p: _version(p) for p in PACKAGES},
        "servers": server_versions(),
        "method": (
            "uncontended acquire+release per cycle; warm-up, then rounds of shuffled subject"
            " order, `pre` untimed cycles before each timed chunk, GC off inside chunks;"
            " ops_s = 1e6 / mean_us for one thread; client_cpu_us = process CPU (all threads)"
            " per timed cycle; round trips counted separately through a counting TCP relay"
        ),
    }


def _fmt(value: Any, spec: str = ",.1f") -> str:
    return "–" if value is None else format(value, spec)


def markdown(result: dict[str, Any]) -> str:
    head = (
        "| backend | subject | RT/cycle | new conns/cycle | p50 µs | p99 µs | ops/s "
        "| × floor (p50) | × floor (paired) | client CPU µs/cycle | round-p50 range µs |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    rows = sorted(
        result["subjects"], key=lambda r: (BACKENDS.index(r["backend"]), KIND_ORDER[r["kind"]])
    )
    for r in rows:
        label = f"**{r['label']}**" if r["kind"] == "fleetcron" else r["label"]
        if "p50_us" not in r:
            lines.append(
                f"| {r['backend']} | {label} | not measured: {r['reason']} | | | | | | | | |"
            )
            continue
        rt = "0 (in-process)" if r["backend"] == "sqlite" else _fmt(r.get("rt_per_cycle"), ".2f")
        conns = "–" if r["backend"] == "sqlite" else _fmt(r.get("conns_per_cycle"), ".2f")
        ratio = "1.00 (floor)" if r["kind"] == "floor" else _fmt(r.get("ratio_p50"), ".2f")
        paired = _fmt(r.get("ratio_paired_median"), ".2f") if r["kind"] != "floor" else "–"
        lines.append(
            f"| {r['backend']} | {label} | {rt} | {conns} | {_fmt(r['p50_us'])} "
            f"| {_fmt(r['p99_us'])} | {_fmt(r['ops_s'], ',.0f')} | {ratio} | {paired} "
            f"| {_fmt(r['client_cpu_us'])} "
            f"| {_fmt(r['round_p50_min_us'], ',.0f')}–{_fmt(r['round_p50_max_us'], ',.0f')} |"
        )
    lines += ["", "| backend | RT/cycle ≤ 2 | p50 ≤ 1.1× floor | faster than every peer |"]
    lines.append("|---|---|---|---|")
    for backend, t in result["targets"].items():
        rt = (
            "n/a (in-process)"
            if backend == "sqlite"
            else (f"{'yes' if t['rt_ok'] else 'NO'} ({_fmt(t['rt_per_cycle'], '.2f')})")
        )
        ratio = f"{'yes' if t['ratio_ok'] else 'NO'} ({_fmt(t['ratio_p50'], '.2f')}×)"
        if not t["peers_measured"]:
            peers = "no peer measured"
        elif t["faster_than_every_measured_peer"]:
            peers = "yes"
        else:
            peers = f"NO (not faster than {', '.join(t['peers_at_least_as_fast'])})"
        if t["peers_not_measured"]:
            peers += f"; not measured: {', '.join(t['peers_not_measured'])}"
        lines.append(f"| {backend} | {rt} | {ratio} | {peers} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=6000, help="timed cycles per subject")
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=200, help="untimed cycles per subject")
    parser.add_argument("--pre", type=int, default=2, help="untimed cycles before each chunk")
    parser.add_argument(
        "--rt-cycles", type=int, default=50, help="cycles in the round-trip counting pass"
    )
    parser.add_argument("--only", default="", help="comma-separated substrings of subject keys")
    parser.add_argument("--seed", type=int, default=None, help="shuffle seed (default: random)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**32)
    return args


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with quiet():
        result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\n(results: {args.out}; {result['meta']['duration_s']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
