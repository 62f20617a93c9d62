"""Side-by-side scheduler benchmark: fleetcron, APScheduler 4, procrastinate and
APScheduler 3 running the same workload on one PostgreSQL.

Run from the project root::

    .venv/bin/python bench/scheduler_peers.py                 # 200 jobs x 4 replicas, 30 s
    .venv/bin/python bench/scheduler_peers.py --jobs 1000 --replicas 8 \
        --out bench/results/scheduler_peers-1000x8.json
    .venv/bin/python bench/scheduler_peers.py --subjects fleetcron,apscheduler3 --seconds 10

The workload: N jobs, each due every second, on R replica processes that share one
PostgreSQL database, measured over D seconds. Every subject runs it in turn, each in a
database of its own that is dropped and created again just before (a clean schema):

- ``fleetcron``: ``AsyncScheduler(store, jobs, SchedulerOptions(namespace, concurrency,
  echo=False))`` over ``job_spec(name, every="1s", overlap="skip", jitter="0s")`` jobs, as
  ``bench/scheduler.py`` runs it, with the project's own interpreter (psycopg 3 async).
- ``apscheduler4``: ``AsyncScheduler(SQLAlchemyDataStore(engine), PsycopgEventBroker)``
  (SQLAlchemy async engine on psycopg 3), role both; every replica configures the one task
  (``max_running_jobs=None``) and adds the N schedules (``IntervalTrigger(seconds=1)``,
  ``coalesce=all``, ``conflict_policy=do_nothing``, fixed ids).
- ``procrastinate``: ``@app.periodic(cron="* * * * * *")`` (croniter's sixth column is
  seconds) once per job with its own ``periodic_id``; every replica runs
  ``app.run_worker_async(concurrency=C)``, whose periodic deferrer defers the jobs (the
  database refuses a (task, periodic id, second) it still holds a row for) and whose
  workers run them.
- ``apscheduler3``: ``AsyncIOScheduler`` with one ``SQLAlchemyJobStore`` (psycopg 3) shared
  by every replica, each adding the N interval jobs with ``replace_existing=True``. The job
  store has no claim: this set-up fires every job on every replica, and the benchmark must
  show that as doubling.

Each peer gets a virtualenv of its own (APScheduler 3 and 4 share the package name), made
on first use under ``--venvs`` with the pinned requirements in :data:`PEERS`; the versions
installed (``importlib.metadata`` inside the venv) go into the results. A replica is a
small program (:data:`PROLOGUE` + the peer's body, written to a temporary file) run with
the peer's interpreter. Its job does nothing but append ``job, nominal slot time, start
time`` to the replica's own file (line-buffered, so nothing is lost if the process dies).

Method, per subject: wait until the machine is quiet (1-minute load average at most
``--max-load`` and, sampled over 3 s, at most ``--max-busy`` cores busy; at most
``--quiet-wait`` seconds), set the database up with the peer's own call (one process, so
replicas do not race to create tables), start the R replicas and wait until each has
registered its jobs and started, then ``--warmup`` seconds more. The window is the next
whole second ``T0`` to ``T0 + D``; slots expected are the N x D (job, second) pairs with
``T0 <= slot < T0 + D``. CPU is read at both ends of the window: ``utime + stime`` of the
replica processes from ``/proc/<pid>/stat`` and of every ``postgres`` process (the whole
server), and the machine's busy time from ``/proc/stat``. After the window the replicas get
``--drain`` seconds to finish late slots, then SIGTERM (SIGKILL after ``--stop-timeout``).

Reported per subject:

- slots expected, slots ran (distinct (job, slot) of the window executed), doubled (extra
  executions of those slots: executions - distinct; and, whatever the slot's time, the
  executions started in the window that repeated a slot already run), missed (expected -
  ran: not run by the window's end + drain);
- fire lag p50 / p99 / max = first execution's start - the slot's nominal time, over the
  slots that ran (same host, same clock);
- runs per replica (executions of the window's slots) and min / max against the fair share;
- client CPU per run and PostgreSQL CPU per run: CPU over the window divided by the runs
  that started in it (distinct (job, slot), any slot time);
- PostgreSQL CPU twice: every ``postgres`` process (the whole server, so any other user's
  work on it too), and only the backends connected to the subject's database;
- status: ``ok``, or what went wrong: ``failed`` (at set-up or start-up), ``crashed`` (a
  replica exited), ``hung`` (a live replica ran nothing in the window, or ignored SIGTERM),
  ``doubled``, ``missed`` (slots not run by the window's end + drain), with the tail of the
  output of the replicas concerned.

Results: a markdown table on stdout and ``bench/results/scheduler_peers.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "scheduler_peers.json"
VENVS = Path(tempfile.gettempdir()) / "fleetcron-peer-venvs"
PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
ADMIN_DB = "postgres"
DB_PREFIX = "fleetcron_peers_"
TAIL_LINES = 20


def _load_scheduler_bench() -> ModuleType:
    """``bench/scheduler.py``, for its CPU readers and percentile."""
    spec = importlib.util.spec_from_file_location(
        "fleetcron_bench_scheduler", HERE / "scheduler.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_SCHED = _load_scheduler_bench()
proc_cpu_s = _SCHED.proc_cpu_s
server_cpu_s = _SCHED.server_cpu_s
percentile = _SCHED.percentile
rss_mb = _SCHED.rss_mb


# -- replica programs ---------------------------------------------------------------------
#
# A program is PROLOGUE + a peer's body. It reads its settings from argv[1] (JSON: mode
# "setup" or "run", url, jobs, replica, concurrency, record, ready) and, in a run, calls
# record() from the job and ready() once its jobs are registered and its scheduler started.

PROLOGUE = """\
import asyncio
import json
import math
import os
import signal
import sys
import time

CFG = json.loads(sys.argv[1])
JOBS = [f"job-{i:05d}" for i in range(CFG["jobs"])]
_OUT = open(CFG["record"], "a", buffering=1) if CFG["mode"] == "run" else None


def record(job, slot, started):
    _OUT.write(f"{job}\\t{slot:.6f}\\t{started:.6f}\\n")


def ready():
    with open(CFG["ready"] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(CFG["ready"] + ".tmp", CFG["ready"])


def facts(value):
    print(json.dumps(value), flush=True)


def stop_event():
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event

"""

FLEETCRON = """\
from fleetcron.job_options import job_spec
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores import open_async_store, parse_store_url


async def noop(ctx):
    record(ctx.job, ctx.slot_us / 1e6, time.time())


async def main():
    store = await open_async_store(parse_store_url(CFG["url"]))
    if CFG["mode"] == "setup":
        await store.run(store.ops.store_now())  # opens the store: creates the schema
        await store.close()
        return
    jobs = [
        job_spec(name, where="bench", call=noop, every="1s", overlap="skip", jitter="0s")
        for name in JOBS
    ]
    options = SchedulerOptions(namespace="bench", concurrency=CFG["concurrency"], echo=False)
    scheduler = AsyncScheduler(store, jobs, options)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, scheduler.stop)
    loop.add_signal_handler(signal.SIGINT, scheduler.stop)
    task = asyncio.create_task(scheduler.run())
    await scheduler.signals.started.wait()
    ready()
    try:
        await task
    finally:
        await store.close()


asyncio.run(main())
"""

APSCHEDULER4 = """\
from datetime import datetime, timezone

from apscheduler import AsyncScheduler, CoalescePolicy, ConflictPolicy, current_job
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.psycopg import PsycopgEventBroker
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy.ext.asyncio import create_async_engine


async def noop():
    started = time.time()
    job = current_job.get()
    record(job.schedule_id, job.scheduled_fire_time.timestamp(), started)


async def main():
    engine = create_async_engine(CFG["url"], pool_size=5, max_overflow=CFG["pool_overflow"])
    store = SQLAlchemyDataStore(engine)
    broker = PsycopgEventBroker.from_async_sqla_engine(engine)
    scheduler = AsyncScheduler(store, broker, max_concurrent_jobs=CFG["concurrency"])
    async with scheduler:
        if CFG["mode"] == "setup":
            return  # entering the scheduler created the tables
        await scheduler.configure_task("noop", func=noop, max_running_jobs=None)
        start = datetime.fromtimestamp(math.ceil(time.time()) + 1, timezone.utc)
        for name in JOBS:
            await scheduler.add_schedule(
                "noop",
                IntervalTrigger(seconds=1, start_time=start),
                id=name,
                coalesce=CoalescePolicy.all,
                conflict_policy=ConflictPolicy.do_nothing,
            )
        stop = stop_event()
        await scheduler.start_in_background()
        ready()
        await stop.wait()
        await scheduler.stop()
        await scheduler.wait_until_stopped()
    await engine.dispose()


asyncio.run(main())
"""

PROCRASTINATE = """\
import logging

import croniter
import procrastinate
from procrastinate import periodic

logging.getLogger("procrastinate").setLevel(logging.ERROR)  # the app-in-__main__ warning
CRON = "* * * * * *"
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=CFG["url"]))


async def noop(timestamp: int, job: str) -> None:
    record(job, timestamp, time.time())


task = app.task(name="bench_noop")(noop)
for name in JOBS:
    app.periodic(cron=CRON, periodic_id=name, task_kwargs={"job": name})(task)


async def main():
    async with app.open_async():
        if CFG["mode"] == "setup":
            await app.schema_manager.apply_schema_async()
            base = 1_700_000_000.0
            step = croniter.croniter(CRON, base).get_next(float) - base
            facts({"cron": CRON, "cron_step_s": step, "deferrer_margin_s": periodic.MARGIN})
            return
        ready()
        await app.run_worker_async(
            concurrency=CFG["concurrency"],
            name=f"replica-{CFG['replica']}",
            install_signal_handlers=True,
        )


asyncio.run(main())
"""

APSCHEDULER3 = """\
from datetime import datetime, timezone

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler


async def noop():
    return time.time()  # the listener records it with the event's scheduled run time


def on_event(event):
    if event.code == EVENT_JOB_EXECUTED:
        record(event.job_id, event.scheduled_run_time.timestamp(), event.retval)
    else:
        print(f"{event.job_id} {event.scheduled_run_time}: event {event.code}", file=sys.stderr)


async def main():
    store = SQLAlchemyJobStore(url=CFG["url"])
    if CFG["mode"] == "setup":
        store.start(None, "default")  # creates the table
        store.shutdown()
        return
    scheduler = AsyncIOScheduler(
        jobstores={"default": store},
        job_defaults={"coalesce": False, "misfire_grace_time": None, "max_instances": 1},
        timezone=timezone.utc,
    )
    scheduler.add_listener(on_event, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED)
    scheduler.start()
    start = datetime.fromtimestamp(int(time.time()) + 2, timezone.utc)
    for name in JOBS:
        scheduler.add_job(
            noop, "interval", seconds=1, start_date=start, id=name, replace_existing=True
        )
    stop = stop_event()
    ready()
    await stop.wait()
    scheduler.shutdown(wait=True)


asyncio.run(main())
"""


@dataclass(frozen=True)
class Peer:
    """One subject: how to build its interpreter, its replica program, how it connects."""

    name: str
    requirements: tuple[str, ...]  # pinned; empty: the project's own interpreter
    distributions: tuple[str, ...]  # whose installed versions go into the results
    body: str
    url_scheme: str  # the URL scheme the peer's client expects
    config: str  # what it runs with, for the report

    def program(self) -> str:
        return PROLOGUE + self.body


PEERS: dict[str, Peer] = {
    "fleetcron": Peer(
        name="fleetcron",
        requirements=(),
        distributions=("fleetcron", "psycopg", "psycopg-binary"),
        body=FLEETCRON,
        url_scheme="postgresql",
        config=(
            "fleetcron AsyncScheduler, mode claim, concurrency {c} per replica, "
            "job_spec(every=1s, overlap=skip, jitter=0s), async job; store: PostgreSQL "
            "via psycopg 3 async (the project's own store); no broker"
        ),
    ),
    "apscheduler4": Peer(
        name="apscheduler4",
        requirements=(
            "apscheduler==4.0.0a6",
            "sqlalchemy[asyncio]==2.1.9",
            "psycopg[binary]==3.3.9",
            "anyio==4.16.0",
            "sniffio==1.3.1",  # apscheduler 4.0.0a6 imports it; anyio 4.16 no longer brings it
        ),
        distributions=("apscheduler", "sqlalchemy", "psycopg", "anyio", "sniffio"),
        body=APSCHEDULER4,
        url_scheme="postgresql+psycopg",
        config=(
            "AsyncScheduler(role=both, max_concurrent_jobs={c}); data store: "
            "SQLAlchemyDataStore on an async engine, psycopg 3 driver, pool_size=5, "
            "max_overflow={o}; event broker: PsycopgEventBroker (LISTEN/NOTIFY) from the "
            "same engine; one task (max_running_jobs=None), N schedules IntervalTrigger(seconds=1) "
            "with coalesce=all, misfire_grace_time=None, conflict_policy=do_nothing, added "
            "by every replica; async job"
        ),
    ),
    "procrastinate": Peer(
        name="procrastinate",
        requirements=("procrastinate==3.10.0", "psycopg[binary,pool]==3.3.9"),
        distributions=("procrastinate", "croniter", "psycopg", "psycopg-pool"),
        body=PROCRASTINATE,
        url_scheme="postgresql",
        config=(
            "App(PsycopgConnector) (psycopg 3 async pool, defaults); one task, N "
            "@app.periodic(cron='* * * * * *', periodic_id=job) entries; every replica runs "
            "run_worker_async(concurrency={c}) = periodic deferrer + workers, listen_notify on, "
            "delete_jobs=never (default); async job"
        ),
    ),
    "apscheduler3": Peer(
        name="apscheduler3",
        requirements=(
            "apscheduler==3.11.3",
            "sqlalchemy==2.1.9",
            "psycopg[binary]==3.3.9",
        ),
        distributions=("apscheduler", "sqlalchemy", "psycopg", "tzlocal"),
        body=APSCHEDULER3,
        url_scheme="postgresql+psycopg",
        config=(
            "AsyncIOScheduler + AsyncIOExecutor; job store: one SQLAlchemyJobStore (sync "
            "engine, psycopg 3 driver) shared by every replica; N add_job(interval, seconds=1, "
            "replace_existing=True) from every replica; coalesce=False, "
            "misfire_grace_time=None, max_instances=1; async job, start time returned to an "
            "EVENT_JOB_EXECUTED listener"
        ),
    ),
}

CAVEATS: dict[str, list[str]] = {
    "fleetcron": [
        "the job is an async function here; bench/scheduler.py runs a sync one (a thread "
        "hop per run), so its CPU figures are not directly comparable with these",
        "every slot writes a ledger row (claim, then finish): durable history that the "
        "peers keep in other forms or not at all",
    ],
    "apscheduler4": [
        "pre-release (4.0.0a6); its AsyncpgEventBroker fails with anyio 4.16 "
        "(NoEventLoopError in the LISTEN callback), so the psycopg broker is used",
        "one shared task with max_running_jobs=None: no per-task running-jobs bookkeeping, "
        "the cheapest configuration for it",
    ],
    "procrastinate": [
        "its cron takes a sixth (seconds) column, so the every-second workload runs as is; "
        "the periodic deferrer oversleeps each wake-up by MARGIN (0.5 s) on purpose, so "
        "its fire lag has a floor of about 0.5 s by design",
        "a slot is a queued job: every replica tries to defer every (task, second) (one "
        "INSERT each, the database drops duplicates), then a worker fetches and finishes "
        "it - a work queue, more work per run than a scheduler's claim",
        "its duplicate guard keeps only the newest deferred second per periodic task: "
        "procrastinate_defer_periodic_job_v2 deletes the procrastinate_periodic_defers rows "
        "of older seconds when it defers a newer one, so a deferrer running behind another "
        "can defer an older second again (two jobs for one (task, second) in "
        "procrastinate_jobs); that shows up here as doubling once the deferrers fall behind",
    ],
    "apscheduler3": [
        "a SQLAlchemyJobStore shared by several schedulers is not supported by APScheduler "
        "3 (no locking): every replica runs every due job, shown here as doubling",
    ],
}

GENERAL_CAVEATS = [
    "PostgreSQL CPU ('all') is the sum over every process named postgres (backends and "
    "background workers) read at the window's ends, so it also holds any other user's "
    "work on the server; 'own backends' is the backends connected to the subject's "
    "database when the window starts (no background writer, WAL writer or checkpointer); "
    "a backend that exits inside the window is in neither",
    "client CPU is the replica processes only (all their threads); runs = distinct "
    "(job, slot) whose first execution started inside the window",
    "fire lag is taken at the job function's entry against the slot's nominal time, both "
    "from the host clock; missed slots have no lag and are not in the percentiles",
    "2 vCPUs: the replicas and the server compete for the same two cores; the busy cores "
    "of the replicas, PostgreSQL and the whole machine over the window are reported for "
    "each subject, and 'other processes' = machine - replicas - PostgreSQL - interrupts "
    "(another user's work on the machine, and this harness's own polling)",
    "autovacuum is off on this server; each subject starts on a fresh database",
]


# -- environment ---------------------------------------------------------------------------


def run_text(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def ensure_venv(peer: Peer, venvs: Path) -> str:
    """The interpreter for ``peer``: the project's own, or a venv made (or refreshed when
    its pinned requirements changed) under ``venvs``."""
    if not peer.requirements:
        return sys.executable
    venv = venvs / peer.name
    python = venv / "bin" / "python"
    wanted = "\n".join(peer.requirements) + "\n"
    marker = venv / "fleetcron-bench-requirements.txt"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return str(python)
    print(f"[{peer.name}] preparing {venv}", file=sys.stderr)
    if not python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        made = run_text([sys.executable, "-m", "venv", str(venv)], timeout=300)
        if made.returncode:
            raise RuntimeError(f"venv creation failed:\n{tail(made.stderr)}")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    installed = run_text([*pip, *peer.requirements], timeout=900)
    if installed.returncode:
        raise RuntimeError(f"pip install failed:\n{tail(installed.stderr)}")
    marker.write_text(wanted)
    return str(python)


def versions(python: str, distributions: tuple[str, ...]) -> dict[str, str | None]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(d):\n"
        "    try:\n"
        "        return m.version(d)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({d: v(d) for d in sys.argv[1:]}))\n"
    )
    done = run_text([python, "-c", code, *distributions], timeout=60)
    if done.returncode:
        return {"error": tail(done.stderr)}
    found: dict[str, str | None] = json.loads(done.stdout)
    found["python"] = run_text(
        [python, "-c", "import platform; print(platform.python_version())"], timeout=60
    ).stdout.strip()
    return found


def git_state() -> dict[str, Any]:
    head = run_text(["git", "-C", str(ROOT), "rev-parse", "HEAD"], 30).stdout.strip()
    dirty = run_text(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], 30)
    return {"head": head or None, "src_dirty": bool(dirty.stdout.strip())}


def admin_exec(*statements: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/{ADMIN_DB}", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def reset_database(name: str) -> None:
    admin_exec(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    admin_exec(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_facts() -> dict[str, Any]:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/{ADMIN_DB}", autocommit=True) as conn:
        facts = {}
        for setting in ("server_version", "max_connections", "synchronous_commit", "autovacuum"):
            row = conn.execute(f"SHOW {setting}").fetchone()  # type: ignore[arg-type]
            facts[setting] = row[0] if row else None
        return facts


# -- machine load ----------------------------------------------------------------------------


def _cpu_line() -> list[int]:
    """The machine's ``cpu`` line of ``/proc/stat``: user nice system idle iowait irq
    softirq steal (clock ticks, all cores, since boot)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent neither idle nor waiting on I/O."""
    fields = _cpu_line()
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def machine_irq_s() -> float:
    """CPU seconds spent in interrupts and softirqs (loopback traffic among them), which
    no process is charged with."""
    fields = _cpu_line()
    return (fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def busy_cores(seconds: float) -> float:
    before = machine_busy_s()
    time.sleep(seconds)
    return (machine_busy_s() - before) / seconds


def wait_until_quiet(args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Wait (at most ``--quiet-wait`` s) for a 1-minute load average <= ``--max-load`` and
    at most ``--max-busy`` cores busy over 3 s; say what was seen."""
    started = time.time()
    checks = []
    while True:
        load = loadavg()
        busy = busy_cores(3.0)
        checks.append({"load": load, "busy_cores": round(busy, 2)})
        quiet = load[0] <= args.max_load and busy <= args.max_busy
        waited = time.time() - started
        if quiet or waited >= args.quiet_wait:
            break
        print(
            f"[{label}] waiting for a quiet machine: load {load[0]:.2f}, busy {busy:.2f} cores",
            file=sys.stderr,
        )
        time.sleep(min(15.0, max(0.0, args.quiet_wait - waited)))
    return {
        "quiet": quiet,
        "waited_s": round(time.time() - started, 1),
        "load_at_start": checks[-1]["load"],
        "busy_cores_at_start": checks[-1]["busy_cores"],
        "checks": len(checks),
    }


# -- one subject -----------------------------------------------------------------------------


@dataclass
class Replica:
    index: int
    proc: subprocess.Popen[bytes]
    record: Path
    ready: Path
    log: Path
    exit_code: int | None = None
    exited_at: float | None = None
    killed: bool = False


def pool_overflow(replicas: int) -> int:
    """SQLAlchemy's default pool overflow (10) for APScheduler 4, cut where R replicas of 5
    + overflow connections and a broker connection each would pass max_connections = 100."""
    return max(0, min(10, 90 // replicas - 6))


def describe(peer: Peer, args: argparse.Namespace) -> str:
    return peer.config.format(c=args.concurrency, o=pool_overflow(args.replicas))


def config_arg(args: argparse.Namespace, url: str, **extra: Any) -> str:
    return json.dumps(
        {"url": url, "jobs": args.jobs, "concurrency": args.concurrency}
        | {"pool_overflow": pool_overflow(args.replicas), "replica": -1}
        | {"record": "", "ready": ""}
        | extra
    )


def stop_replicas(replicas: list[Replica], timeout: float) -> None:
    for r in replicas:
        if r.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + timeout
    for r in replicas:
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            r.killed = True
            r.proc.kill()
            r.proc.wait()
        if r.exit_code is None:
            r.exit_code = r.proc.returncode


def read_records(path: Path) -> list[tuple[str, float, float]]:
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue  # a line cut short by a kill
        with contextlib.suppress(ValueError):
            rows.append((parts[0], float(parts[1]), float(parts[2])))
    return rows


def run_subject(peer: Peer, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    result: dict[str, Any] = {
        "subject": peer.name,
        "config": describe(peer, args),
        "caveats": CAVEATS.get(peer.name, []),
        "problems": [],
    }
    database = DB_PREFIX + peer.name
    result["database"] = database
    try:
        python = ensure_venv(peer, args.venvs)
        result["python"] = python
        result["versions"] = versions(python, peer.distributions)
    except Exception as exc:
        return _failed(result, "failed", f"environment: {exc}")
    url = f"{peer.url_scheme}://postgres@127.0.0.1:5432/{database}"
    program = tmp / f"{peer.name}_replica.py"
    program.write_text(peer.program())
    result["quiet"] = wait_until_quiet(args, peer.name)
    reset_database(database)
    setup = run_text(
        [python, str(program), config_arg(args, url, mode="setup")],
        timeout=args.startup_timeout,
        cwd=ROOT,
    )
    if setup.returncode:
        return _failed(result, "failed", f"set-up exited {setup.returncode}", setup.stderr)
    with contextlib.suppress(ValueError):
        lines = setup.stdout.strip().splitlines()
        result["peer_facts"] = json.loads(lines[-1]) if lines else {}
    replicas: list[Replica] = []
    started = time.time()
    try:
        for i in range(args.replicas):
            stem = tmp / f"{peer.name}-{i}"
            rec, rdy, log = (stem.with_suffix(ext) for ext in (".rec", ".ready", ".log"))
            cfg = config_arg(args, url, mode="run", replica=i, record=str(rec), ready=str(rdy))
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [python, str(program), cfg], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
                )
            replicas.append(Replica(i, proc, rec, rdy, log))
        outcome = _await_ready(replicas, args.startup_timeout)
        result["startup_s"] = round(time.time() - started, 1)
        if outcome:
            return _failed(result, "failed", outcome, replicas=replicas, args=args)
        print(
            f"[{peer.name}] {args.replicas} replicas ready after {result['startup_s']} s;"
            f" warm-up {args.warmup} s, window {args.seconds} s",
            file=sys.stderr,
        )
        _watch(replicas, time.time() + args.warmup)
        t0 = math.ceil(time.time())
        backends = subject_backends(database)
        _watch(replicas, t0)
        before = _cpu_reading(replicas, backends)
        _watch(replicas, t0 + args.seconds)
        after = _cpu_reading(replicas, backends)
        rss = [rss_mb(r.proc.pid) for r in replicas]
        _watch(replicas, time.time() + args.drain)
    finally:
        stop_replicas(replicas, args.stop_timeout)
    result["window"] = {"t0": t0, "t1": t0 + args.seconds}
    result.update(_summarise(args, replicas, t0, before, after, rss))
    return result


def _await_ready(replicas: list[Replica], timeout: float) -> str | None:
    deadline = time.time() + timeout
    while not all(r.ready.exists() for r in replicas):
        for r in replicas:
            if r.proc.poll() is not None and not r.ready.exists():
                r.exit_code, r.exited_at = r.proc.returncode, time.time()
                return f"replica {r.index} exited with code {r.exit_code} during start-up"
        if time.time() > deadline:
            waiting = [r.index for r in replicas if not r.ready.exists()]
            return f"hung at start-up: replicas {waiting} not ready after {timeout:.0f} s"
        time.sleep(0.05)
    return None


def _watch(replicas: list[Replica], until: float) -> None:
    """Sleep until ``until``, noting when a replica exits."""
    while True:
        now = time.time()
        for r in replicas:
            if r.exited_at is None and r.proc.poll() is not None:
                r.exit_code, r.exited_at = r.proc.returncode, now
        if now >= until:
            return
        time.sleep(min(0.1, until - now))


def subject_backends(database: str) -> list[int]:
    """The PostgreSQL backends connected to ``database`` (the subject's, and only its)."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/{ADMIN_DB}", autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,))
        return [int(row[0]) for row in rows.fetchall()]


def _cpu_reading(replicas: list[Replica], backends: list[int]) -> dict[str, Any]:
    return {
        "time": time.time(),
        "client": sum(proc_cpu_s(r.proc.pid) for r in replicas),
        "server": server_cpu_s(PG_SERVER + "/" + ADMIN_DB) or 0.0,
        "backends": {pid: proc_cpu_s(pid) for pid in backends if Path(f"/proc/{pid}").exists()},
        "machine": machine_busy_s(),
        "irq": machine_irq_s(),
    }


def _failed(
    result: dict[str, Any],
    status: str,
    problem: str,
    output: str | None = None,
    replicas: list[Replica] | None = None,
    args: argparse.Namespace | None = None,
) -> dict[str, Any]:
    if replicas is not None and args is not None:
        stop_replicas(replicas, args.stop_timeout)
        result["replicas"] = [_replica_report(r, []) for r in replicas]
    result["status"] = status
    result["problems"].append(problem)
    if output is not None:
        result["error_tail"] = tail(output)
    elif replicas:
        result["error_tail"] = next(
            (rep["log_tail"] for rep in result["replicas"] if rep["log_tail"]), ""
        )
    return result


def _replica_report(r: Replica, rows: list[tuple[str, float, float]]) -> dict[str, Any]:
    log = r.log.read_text(errors="replace") if r.log.exists() else ""
    return {
        "index": r.index,
        "pid": r.proc.pid,
        "exit_code": r.exit_code,
        "killed_after_sigterm": r.killed,
        "executions": len(rows),
        "log_tail": tail(log),
    }


def _summarise(
    args: argparse.Namespace,
    replicas: list[Replica],
    t0: int,
    before: dict[str, Any],
    after: dict[str, Any],
    rss: list[float | None],
) -> dict[str, Any]:
    t1 = t0 + args.seconds
    per_replica = [read_records(r.record) for r in replicas]
    executions: Counter[tuple[str, int]] = Counter()
    first_start: dict[tuple[str, int], float] = {}
    runs_by_replica: list[int] = []
    in_window_by_replica: list[int] = []
    off_grid = 0
    for rows in per_replica:
        mine = 0
        in_window = 0
        for job, slot, start in rows:
            second = round(slot)
            if abs(slot - second) > 1e-3:
                off_grid += 1
            key = (job, second)
            if start < first_start.get(key, math.inf):
                first_start[key] = start
            if t0 <= start < t1:
                in_window += 1
            if t0 <= second < t1:
                executions[key] += 1
                mine += 1
        runs_by_replica.append(mine)
        in_window_by_replica.append(in_window)
    expected = args.jobs * args.seconds
    ran = len(executions)
    doubled = sum(n - 1 for n in executions.values())
    doubled_slots = sum(1 for n in executions.values() if n > 1)
    lags_ms = [(first_start[key] - key[1]) * 1e3 for key in executions]
    runs_started = sum(1 for start in first_start.values() if t0 <= start < t1)
    span = after["time"] - before["time"]
    client = after["client"] - before["client"]
    server = after["server"] - before["server"]
    # backends of the subject's database alive at both ends (another user's work on the
    # server is not in it; the server's background processes are not either)
    own = sum(
        cpu - before["backends"][pid]
        for pid, cpu in after["backends"].items()
        if pid in before["backends"]
    )
    machine = after["machine"] - before["machine"]
    irq = after["irq"] - before["irq"]
    fair = sum(runs_by_replica) / len(replicas) if replicas else 0
    problems: list[str] = []
    tags: list[str] = []
    for r in replicas:
        if r.exited_at is not None and r.exited_at < t1 + args.drain:
            problems.append(
                f"replica {r.index} exited with code {r.exit_code} at "
                f"{r.exited_at - t0:+.1f} s from the window's start"
            )
            tags.append("crashed")
        if r.killed:
            problems.append(f"replica {r.index} did not stop within {args.stop_timeout} s")
            tags.append("hung")
    for i, n in enumerate(in_window_by_replica):
        if n == 0 and replicas[i].exited_at is None:
            problems.append(f"replica {i} was alive but ran nothing in the window")
            tags.append("hung")
    # every execution that started in the window is its slot's first or a repeat
    repeats = sum(in_window_by_replica) - runs_started
    if doubled:
        problems.append(f"{doubled_slots:,} slots ran more than once ({doubled:,} extra runs)")
    if repeats:
        problems.append(
            f"{repeats:,} of the executions that started in the window repeated a slot that "
            "had already run (any slot time)"
        )
    if doubled or repeats:
        tags.append("doubled")
    if expected > ran:
        problems.append(
            f"{expected - ran:,} slots of the window not run by its end + {args.drain:g} s"
        )
        tags.append("missed")
    if off_grid:
        problems.append(f"{off_grid:,} executions had a slot time off the whole second")
    status = ", ".join(dict.fromkeys(tags)) or "ok"
    reports = [_replica_report(r, rows) for r, rows in zip(replicas, per_replica, strict=True)]
    troubled = [
        rep
        for rep, n in zip(reports, in_window_by_replica, strict=True)
        if rep["exit_code"] or rep["killed_after_sigterm"] or n == 0
    ]
    tails = dict.fromkeys(rep["log_tail"] for rep in troubled if rep["log_tail"])
    # a replica that is gone at the window's end reads as 0 CPU: no client figure then
    client_ok = all(r.exited_at is None or r.exited_at > after["time"] for r in replicas)
    if not client_ok:
        problems.append("a replica exited inside the window: client CPU not measured")
    return {
        "status": status,
        "problems": problems,
        "error_tail": "\n--\n".join(list(tails)[:2]),
        "slots_expected": expected,
        "slots_ran": ran,
        "doubled": doubled,
        "doubled_slots": doubled_slots,
        "missed": expected - ran,
        "lag_ms_p50": percentile(lags_ms, 50),
        "lag_ms_p99": percentile(lags_ms, 99),
        "lag_ms_max": max(lags_ms) if lags_ms else None,
        "runs_per_replica": runs_by_replica,
        "share_min_vs_fair": min(runs_by_replica) / fair if fair else None,
        "share_max_vs_fair": max(runs_by_replica) / fair if fair else None,
        "runs_started_in_window": runs_started,
        "executions_started_in_window": sum(in_window_by_replica),
        "repeats_started_in_window": repeats,
        "executions_total": sum(len(rows) for rows in per_replica),
        "client_cpu_s": client if client_ok else None,
        "client_cpu_ms_per_run": (
            1e3 * client / runs_started if runs_started and client_ok else None
        ),
        "client_cpu_cores": client / span if client_ok else None,
        "server_cpu_s": server,
        "server_cpu_ms_per_run": 1e3 * server / runs_started if runs_started else None,
        "server_cpu_cores": server / span,
        "subject_backends": len(before["backends"]),
        "subject_backends_cpu_s": own,
        "subject_backends_cpu_ms_per_run": 1e3 * own / runs_started if runs_started else None,
        "machine_busy_cores": machine / span,
        "irq_cores": irq / span,
        "other_busy_cores": (machine - client - server - irq) / span,
        "rss_mb_per_replica_max": max((m for m in rss if m), default=None),
        "replicas": reports,
    }


# -- report ----------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ",.1f") -> str:
    return "–" if value is None else format(value, spec)


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    a = meta["args"]
    lines = [
        f"### {a['jobs']} jobs × {a['replicas']} replicas, every 1 s, {a['seconds']} s window"
        f" (warm-up {a['warmup']} s, drain {a['drain']} s, concurrency {a['concurrency']})",
        "",
        "| subject | version | status | slots expected | ran "
        "| doubled: window slots / repeats in window | missed "
        "| fire lag p50 / p99 (ms) | runs per replica | client CPU ms/run "
        "| PG CPU ms/run: all / own backends "
        "| busy cores (client / PG / machine) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in results["subjects"]:
        version = (s.get("versions") or {}).get(PEERS[s["subject"]].distributions[0])
        if "slots_expected" not in s:
            lines.append(
                f"| {s['subject']} | {version or '–'} | **{s['status']}** "
                "| – | – | – | – | – | – | – | – | – |"
            )
            continue
        status = s["status"] if s["status"] == "ok" else f"**{s['status']}**"
        lines.append(
            f"| {s['subject']} | {version or '–'} | {status} | {s['slots_expected']:,} "
            f"| {s['slots_ran']:,} | {s['doubled']:,} / {s['repeats_started_in_window']:,} "
            f"| {s['missed']:,} "
            f"| {_fmt(s['lag_ms_p50'])} / {_fmt(s['lag_ms_p99'])} "
            f"| {' / '.join(f'{n:,}' for n in s['runs_per_replica'])} "
            f"| {_fmt(s['client_cpu_ms_per_run'], '.2f')} "
            f"| {_fmt(s['server_cpu_ms_per_run'], '.2f')} / "
            f"{_fmt(s['subject_backends_cpu_ms_per_run'], '.2f')} "
            f"| {_fmt(s['client_cpu_cores'], '.2f')} / {s['server_cpu_cores']:.2f} / "
            f"{s['machine_busy_cores']:.2f} |"
        )
    lines.append("")
    for s in results["subjects"]:
        quiet = s.get("quiet") or {}
        lines.append(
            f"- **{s['subject']}**: {s['config']}. Load before: "
            f"{_fmt((quiet.get('load_at_start') or [None])[0], '.2f')} (1 min), "
            f"{_fmt(quiet.get('busy_cores_at_start'), '.2f')} cores busy"
            + (
                f"; in the window, other processes used {s['other_busy_cores']:.2f} cores"
                f" and interrupts {s['irq_cores']:.2f} cores."
                if "other_busy_cores" in s
                else "."
            )
        )
        lines.extend(f"  - problem: {p}" for p in s["problems"])
        if s.get("error_tail"):
            lines += ["  ```", *("  " + x for x in s["error_tail"].splitlines()), "  ```"]
        lines.extend(f"  - caveat: {c}" for c in s["caveats"])
        if s.get("peer_facts"):
            lines.append(f"  - peer facts: `{json.dumps(s['peer_facts'])}`")
    lines += ["", *(f"- {c}" for c in meta["caveats"])]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--subjects",
        default=",".join(PEERS),
        help=f"comma-separated, run in this order (from: {', '.join(PEERS)})",
    )
    parser.add_argument("--jobs", "-n", type=int, default=200, help="N jobs, each every 1 s")
    parser.add_argument("--replicas", "-r", type=int, default=4, help="R replica processes")
    parser.add_argument("--seconds", "-d", type=int, default=30, help="D: the measured window")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after start-up")
    parser.add_argument("--drain", type=float, default=5.0, help="seconds for late slots")
    parser.add_argument(
        "--concurrency", "-c", type=int, default=16, help="runs in flight per replica"
    )
    parser.add_argument("--venvs", type=Path, default=VENVS, help="where the peers' venvs live")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--stop-timeout", type=float, default=20.0)
    parser.add_argument("--max-load", type=float, default=1.5, help="1-min load to start at")
    parser.add_argument("--max-busy", type=float, default=0.5, help="busy cores to start at")
    parser.add_argument("--quiet-wait", type=float, default=300.0, help="most to wait, s")
    parser.add_argument("--keep", action="store_true", help="keep the subjects' databases")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    unknown = [s for s in args.subjects.split(",") if s not in PEERS]
    if unknown:
        parser.error(f"unknown subjects {unknown}; known: {', '.join(PEERS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-peers-"))
    meta: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_at_start": loadavg(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "node": hashlib.sha256(platform.node().encode()).hexdigest()[:8],
        },
        "postgres": server_facts(),
        "fleetcron_git": git_state(),
        "caveats": GENERAL_CAVEATS,
    }
    subjects = []
    try:
        for name in args.subjects.split(","):
            peer = PEERS[name]
            print(f"[{name}] starting", file=sys.stderr)
            try:
                result = run_subject(peer, args, tmp)
            except Exception as exc:
                result = {"subject": name, "config": describe(peer, args)}
                result["caveats"] = CAVEATS[name]
                result |= {"status": "failed", "problems": [f"{type(exc).__name__}: {exc}"]}
            finally:
                if not args.keep:
                    with contextlib.suppress(Exception):
                        drop_database(DB_PREFIX + name)
            print(f"[{name}] {result['status']}", file=sys.stderr)
            subjects.append(result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta["duration_s"] = round(time.time() - began, 1)
    results = {"meta": meta, "subjects": subjects}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    print(f"\n(results: {args.out}; {meta['duration_s']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
