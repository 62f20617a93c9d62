"""The status read at thousands of jobs: ``fleetcron status``, the dashboard's ``/api/status``
and ``/``, timed on one or more source trees in turns.

Run from the project root::

    .venv/bin/python bench/status_read.py                      # 5,000 jobs, SQLite and PostgreSQL
    git archive <commit> src | tar -x -C /tmp/before            # an older tree to compare with
    .venv/bin/python bench/status_read.py --code before=/tmp/before/src --code after=src
    .venv/bin/python bench/status_read.py --backend sqlite --jobs 1000 --rounds 3

Method. For each source tree (``--code NAME=PATH``, default this tree's ``src``) and each
backend, the script makes a store of its own (a SQLite file in a temporary directory, a
fresh PostgreSQL database dropped at the end) and lets that tree's ``fleetcron migrate``
create the schema. Then it writes the same namespace into every store, from one random
seed, with plain ``INSERT``s (a scheduler would take hours to leave this much history):

- ``--jobs`` job rows with real definitions (``job_spec``): ``every 1h`` (40 %), cron
  ``M * * * *`` in Europe/Berlin (20 %), cron ``M H * * *`` in Europe/Berlin (20 %),
  ``every 6h`` (10 %), cron ``*/30 * * * *`` (10 %), with a random minute M and hour H per
  job (a fleet spreads its jobs over the hour: few jobs share a cron expression) —
  intervals long enough that few verdicts change while the benchmark runs;
- for each job ``--runs`` ledger rows (5-20 by default) at its latest slots, durations of
  0.2 s to 2 min, an output of 0.1-2 KB per run (the stored tail of a job's stdout; 0.5-4
  KB and an error for a failure); most jobs healthy, some failing, overdue, running,
  stuck (running for two hours), starved (three skipped slots), never successful, or
  paused;
- a job lease row per job, an alert marker per unhealthy job, the leader lease, four
  replicas.

Each subject is then timed ``--rounds`` times, the trees in turns (a shuffled order each
round): ``fleetcron status`` and ``status --json`` as processes (wall time, the start of the
interpreter included: the figure an operator sees), and ``GET /api/status``, ``GET /``
and, where the tree pages them, ``GET /api/status?limit=50``, ``…&state=overdue``,
``GET /?state=overdue`` and ``GET /?page=20`` from one ``fleetcron web`` per tree (wall
time of the whole answer over HTTP; the first answer of each server is left out). A probe
process per tree also times the parts of one read in-process, best of ``--probe-repeats``:
the store's statements (how many round trips, how many statements they ran, how long, rows
returned), the rest of the read (decoding, the health rules), the JSON and the page.

``--burn N`` keeps N processes spinning on the CPU while the subjects are timed (the
reports of slow reads came from a loaded host). Results: a markdown table on stdout and
``bench/results/status_read.json`` (``--out``). The host is shared: compare trees within
one run, and read the medians with their spread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "status_read.json"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
NAMESPACE = "bench-status"
S = 1_000_000
RUN_COLUMNS = (
    "namespace job slot_us state attempt fence holder run_id trigger started_us finished_us "
    "expires_us retry_at_us cancel_requested exit_code error output"
).split()
SCHEDULES = (  # (share in 20ths, job_spec options; {m} and {h}: a random minute and hour)
    (8, {"every": "1h"}),
    (4, {"schedule": "{m} * * * *", "timezone": "Europe/Berlin"}),
    (4, {"schedule": "{m} {h} * * *", "timezone": "Europe/Berlin"}),
    (2, {"every": "6h"}),
    (2, {"schedule": "*/30 * * * *"}),
)
KINDS = (  # (share in 100ths, kind)
    (80, "healthy"),
    (5, "failing"),
    (4, "overdue"),
    (3, "running"),
    (2, "stuck"),
    (2, "starved"),
    (2, "never"),
    (2, "paused"),
)
PREVIOUS_RUNNING = "previous run still running (overlap = skip)"


# -- the namespace ------------------------------------------------------------------------
def _pick(rng: random.Random, table: tuple[tuple[int, Any], ...]) -> Any:
    roll = rng.uniform(0, sum(share for share, _ in table))
    for share, value in table:
        roll -= share
        if roll <= 0:
            return value
    return table[-1][1]


def _text(rng: random.Random, low: int, high: int) -> str:
    lines: list[str] = []
    size = rng.randint(low, high)
    while sum(len(line) for line in lines) < size:
        count, batch = rng.randint(0, 10**6), rng.randint(1, 99)
        lines.append(f"{count:>7} records processed in batch {batch}\n")
    return "".join(lines)[-size:]


def build_namespace(jobs: int, runs: tuple[int, int], seed: int, now_us: int) -> dict[str, Any]:
    """The rows of the namespace: jobs, ledger, leases, replicas (plain tuples)."""
    from fleetcron.job_options import job_spec

    rng = random.Random(seed)
    job_rows: list[tuple[Any, ...]] = []
    run_rows: list[tuple[Any, ...]] = []
    lease_rows: list[tuple[Any, ...]] = []
    kinds: dict[str, int] = {}
    for index in range(jobs):
        name = f"job-{index:05d}"
        options = dict(_pick(rng, SCHEDULES))
        if "schedule" in options:
            minute, hour = rng.randrange(60), rng.randrange(24)
            options["schedule"] = options["schedule"].format(m=minute, h=hour)
        spec = job_spec(name, where="bench", command=["true"], **options)
        kind = _pick(rng, KINDS)
        kinds[kind] = kinds.get(kind, 0) + 1
        slots: list[int] = []
        moment = now_us - (3 * 3600 * S if kind == "overdue" else 0)
        count = rng.randint(*runs)
        while len(slots) < count:
            slot = spec.schedule.at_or_before(moment)
            assert slot is not None
            slots.append(slot)
            moment = slot - 1
        rows: list[tuple[Any, ...]] = []
        for position, slot in enumerate(slots):  # newest first
            state, error = "succeeded", None
            output: str | None = _text(rng, 100, 2000)
            begun = slot + rng.randint(50_000, 2 * S)
            started: int | None = begun
            finished: int | None = min(begun + int(rng.uniform(0.2, 120) * S), now_us - S)
            expires: int | None = None
            if kind in ("failing", "never") and (position < 2 or kind == "never"):
                state, output = "failed", _text(rng, 500, 4000)
                error = "exit status 3: upstream timed out after 30s"
            elif kind == "starved" and position < 3:
                state, error, output, started = "skipped", PREVIOUS_RUNNING, None, None
            elif kind in ("running", "stuck") and position == 0:
                state, output, finished = "running", None, None
                started = now_us - (2 * 3600 * S if kind == "stuck" else 10 * S)
                expires = now_us + 4 * 3600 * S  # live for the whole benchmark
            fence = started or slot
            holder = f"web-{index % 4}:{4000 + index % 4}:{secrets.token_hex(8)}"
            code = None if state != "failed" else 3
            # fmt: off
            rows.append((NAMESPACE, name, slot, state, 1, fence, holder, secrets.token_hex(8),
                         "schedule", started, finished, expires, None, False, code, error,
                         output))
            # fmt: on
        run_rows += rows
        success = [int(r[10]) for r in rows if r[3] == "succeeded"]
        failure = [int(r[10]) for r in rows if r[3] == "failed"]
        definition = json.dumps(spec.definition(), sort_keys=True)
        newest = rows[0]
        held_until = newest[11] if newest[3] == "running" else (newest[10] or now_us)
        # fmt: off
        job_rows.append((NAMESPACE, name, kind == "paused", definition, spec.fingerprint(),
                         max(slots), max(success, default=None), max(failure, default=None),
                         now_us - 86_400 * S))
        lease_rows.append((NAMESPACE, f"fleetcron:job:{name}", newest[6], newest[5],
                           newest[9] or newest[2], held_until, held_until))
        if kind in ("failing", "overdue", "stuck", "never"):
            marker = f"web-0:4000:1.{kind}.{secrets.token_hex(16)}"
            lease_rows.append((NAMESPACE, f"fleetcron:alert:{name}", marker, now_us,
                               now_us - 600 * S, now_us + 365 * 86_400 * S, now_us))
    lease_rows.append(
        (
            NAMESPACE,
            "fleetcron:leader",
            "web-0:4000:secret",
            now_us,
            now_us - 3600 * S,
            now_us + 4 * 3600 * S,
            now_us,
        )
    )
    replica_rows = [
        (
            NAMESPACE,
            f"web-{r}:{4000 + r}:0f0f{r}",
            f"web-{r}",
            4000 + r,
            "1.0",
            "claim",
            "a" * 32,
            now_us - 3600 * S,
            now_us,
            now_us + 4 * 3600 * S,
        )
        for r in range(4)
    ]
    # fmt: on
    return {
        "jobs": job_rows,
        "runs": run_rows,
        "leases": lease_rows,
        "replicas": replica_rows,
        "kinds": kinds,
    }


_JOB_INSERT = (
    "INSERT INTO fleetcron_job (namespace, job, paused, definition, fingerprint, "
    "high_water_us, last_success_us, last_failure_us, updated_us) VALUES ({})"
)
_REPLICA_INSERT = (
    "INSERT INTO fleetcron_replica (namespace, replica_id, host, pid, version, mode, "
    "jobs_fingerprint, started_us, last_seen_us, expires_us) VALUES ({})"
)


def write_namespace(url: str, rows: dict[str, Any]) -> None:
    """Insert the rows into the (migrated, empty) store at ``url``."""
    if url.startswith("sqlite://"):
        import sqlite3

        lite = sqlite3.connect(url.removeprefix("sqlite:///"))
        with lite as conn:
            marks = ",".join("?" * 9)
            conn.executemany(_JOB_INSERT.format(marks), rows["jobs"])
            marks = ",".join("?" * len(RUN_COLUMNS))
            conn.executemany(
                f"INSERT INTO fleetcron_run ({','.join(RUN_COLUMNS)}) VALUES ({marks})",
                rows["runs"],
            )
            conn.executemany(
                "INSERT INTO fleetcron_lease (namespace, name, holder, fence, acquired_us, "
                "expires_us, min_until_us) VALUES (?,?,?,?,?,?,?)",
                rows["leases"],
            )
            conn.executemany(_REPLICA_INSERT.format(",".join("?" * 10)), rows["replicas"])
        lite.close()
        return
    import psycopg

    with psycopg.connect(url) as pg, pg.cursor() as cur:
        cur.executemany(_JOB_INSERT.format(",".join(["%s"] * 9)), rows["jobs"])
        with cur.copy(f"COPY fleetcron_run ({','.join(RUN_COLUMNS)}) FROM STDIN") as copy:
            for row in rows["runs"]:
                copy.write_row(row)
        cur.executemany(
            "INSERT INTO fleetcron_lease (namespace, name, holder, fence, acquired_at, "
            "expires_at, min_until) VALUES (%s, %s, %s, %s, to_timestamp(%s / 1e6), "
            "to_timestamp(%s / 1e6), to_timestamp(%s / 1e6))",
            rows["leases"],
        )
        cur.executemany(_REPLICA_INSERT.format(",".join(["%s"] * 10)), rows["replicas"])
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("VACUUM ANALYZE")  # what autovacuum leaves a long-lived database with


# -- stores of their own -----------------------------------------------------------------
@contextlib.contextmanager
def fresh_store(backend: str, tmp: Path, label: str) -> Iterator[str]:
    """The URL of an empty store for one tree: a SQLite file, or a new PostgreSQL database
    dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / f'{label}.db'}"
        return
    import psycopg

    database = f"fleetcron_status_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        yield urllib.parse.urlunsplit(urllib.parse.urlsplit(POSTGRES)._replace(path=f"/{database}"))
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _env(src: str, url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(Path(src).resolve()),
        "FLEETCRON_BACKEND": url,
        "FLEETCRON_NAMESPACE": NAMESPACE,
    }


def _cli(src: str, url: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from fleetcron.cli.main import entry; sys.exit(entry())"
    return subprocess.run(
        [sys.executable, "-c", code, *arguments],
        env=_env(src, url),
        capture_output=True,
        text=True,
        check=False,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def dashboard(src: str, url: str) -> Iterator[str]:
    """``fleetcron web`` of the tree ``src`` over ``url``, until the block ends."""
    port = _free_port()
    code = "import sys; from fleetcron.cli.main import entry; sys.exit(entry())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "web", "--listen", f"127.0.0.1:{port}"],
        env=_env(src, url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fleetcron web did not start: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _get(address: str) -> tuple[float, int, int]:
    """Seconds for the whole answer, its status and its size."""
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(address, timeout=120) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        body, status = error.read(), error.code
    return time.perf_counter() - began, status, len(body)


def _pages(base: str) -> bool:
    """Whether the dashboard at ``base`` pages ``/api/status`` (and warm it up: the first
    answer of a server is not timed)."""
    _get(f"{base}/")
    with urllib.request.urlopen(f"{base}/api/status?limit=1", timeout=120) as response:
        return "page" in json.loads(response.read())


# -- the probe: one read's parts, in-process, on the tree under test ------------------------
PROBE = r"""
import json, sys, time
from fleetcron import status as status_module
from fleetcron.health import assess
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.statements import QueryBatch, SqlResult

url, namespace, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = open_store(parse_store_url(url))
tally = {}

def counted(operation):
    # Pass each statement through, timing it and counting what it returned.
    answer = None
    try:
        statement = operation.send(None)
        while True:
            began = time.perf_counter()
            answer = yield statement
            tally["store_s"] += time.perf_counter() - began
            tally["round_trips"] += 1
            tally["statements"] += len(statement.batch) if isinstance(statement, QueryBatch) else 1
            results = answer if isinstance(answer, list) else [answer]
            tally["rows"] += sum(len(r.rows) for r in results if isinstance(r, SqlResult))
            statement = operation.send(answer)
    except StopIteration as stop:
        return stop.value

def timed(name, build):
    runs = []
    for _ in range(repeats):
        tally.update(store_s=0.0, round_trips=0, statements=0, rows=0)
        began = time.perf_counter()
        value = store.run(counted(build()))
        runs.append({"total_s": time.perf_counter() - began, **tally})
    best = min(runs, key=lambda r: r["total_s"])
    out[name] = {**best, "total_s_runs": [r["total_s"] for r in runs]}
    return value

def clocked(name, fn):
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - began)
    out[name] = {"total_s": min(times), "total_s_runs": times}
    return value

out = {}
status = timed("read_status", lambda: status_module.read_status(store.ops, namespace))
out["jobs"] = len(status.jobs)
clocked("status_json", lambda: json.dumps(status_module.status_json(status)))
from fleetcron.web import render
clocked("index_page", lambda: render.index_page(status))
rows = store.run(store.ops.job_list(namespace))
names = [r.job for r in rows]
ledgers = store.run(store.ops.run_list_many(namespace, names, status_module.HISTORY))
clocked("assess_every_job", lambda: [assess(r, runs) for r, runs in zip(rows, ledgers)])
Page = getattr(status_module, "Page", None)
if Page is not None:
    build = lambda: status_module.read_status(store.ops, namespace, page=Page(limit=50))
    page = timed("read_status_page", build)
    clocked("status_json_page", lambda: json.dumps(status_module.status_json(page)))
    clocked("index_page_page", lambda: render.index_page(page))
store.close()
print(json.dumps(out))
"""


def probe(src: str, url: str, repeats: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, url, NAMESPACE, str(repeats)],
        env=_env(src, url),
        capture_output=True,
        text=True,
        check=True,
    )
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


# -- the run ------------------------------------------------------------------------------
def _burn() -> None:
    while True:
        pass


def _subjects(paged: bool) -> list[tuple[str, str]]:
    """(label, what): ``cli:ARGS`` runs the CLI, ``web:PATH`` asks the dashboard."""
    subjects = [
        ("fleetcron status", "cli:status"),
        ("fleetcron status --json", "cli:status --json"),
        ("GET /api/status", "web:/api/status"),
        ("GET /", "web:/"),
    ]
    if paged:
        subjects += [
            ("GET /api/status?limit=50", "web:/api/status?limit=50"),
            ("GET /api/status?limit=50&state=overdue", "web:/api/status?limit=50&state=overdue"),
            ("GET /?state=overdue", "web:/?state=overdue"),
            ("GET /?page=20", "web:/?page=20"),
        ]
    return subjects


def run(args: argparse.Namespace) -> dict[str, Any]:
    codes = dict(item.split("=", 1) for item in args.code) or {"this": str(ROOT / "src")}
    now_us = int(time.time() * S)
    rows = build_namespace(args.jobs, args.runs, args.seed, now_us)
    print(f"{args.jobs} jobs, {len(rows['runs'])} ledger rows: {rows['kinds']}", file=sys.stderr)
    result: dict[str, Any] = {
        "jobs": args.jobs,
        "ledger_rows": len(rows["runs"]),
        "lease_rows": len(rows["leases"]),
        "kinds": rows["kinds"],
        "rounds": args.rounds,
        "burn": args.burn,
        "codes": codes,
        "backends": {},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    tmp = Path(tempfile.mkdtemp(prefix="fleetcron-status-"))
    for backend in args.backend.split(","):
        with contextlib.ExitStack() as stack:
            urls: dict[str, str] = {}
            for name, src in codes.items():
                url = stack.enter_context(fresh_store(backend, tmp, f"{backend}-{name}"))
                migrated = _cli(src, url, "migrate")
                assert migrated.returncode == 0, migrated.stderr
                write_namespace(url, rows)
                urls[name] = url
            probes = {
                name: probe(src, urls[name], args.probe_repeats) for name, src in codes.items()
            }
            bases = {
                name: stack.enter_context(dashboard(src, urls[name])) for name, src in codes.items()
            }
            paged = {name: _pages(bases[name]) for name in codes}
            burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burn)]
            for burner in burners:
                burner.start()
            samples: dict[str, dict[str, list[float]]] = {name: {} for name in codes}
            sizes: dict[str, dict[str, int]] = {name: {} for name in codes}
            load = []
            try:
                for _ in range(args.rounds):
                    order = list(codes)
                    random.shuffle(order)
                    for name in order:
                        for label, what in _subjects(paged[name]):
                            kind, _, rest = what.partition(":")
                            if kind == "cli":
                                began = time.perf_counter()
                                done = _cli(codes[name], urls[name], *rest.split())
                                took, size = time.perf_counter() - began, len(done.stdout)
                                assert done.returncode in (0, 1), done.stderr
                            else:
                                took, status, size = _get(bases[name] + rest)
                                assert status == 200, (label, status)
                            samples[name].setdefault(label, []).append(took)
                            sizes[name][label] = size
                    load.append(os.getloadavg()[0])
            finally:
                for burner in burners:
                    burner.terminate()
            result["backends"][backend] = {
                "probes": probes,
                "samples": samples,
                "sizes": sizes,
                "load_1m": load,
            }
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['jobs']:,} jobs, {result['ledger_rows']:,} ledger rows, "
        f"{result['lease_rows']:,} lease rows; {result['rounds']} rounds, burn {result['burn']}",
        "",
        "| backend | subject | "
        + " | ".join(f"{code}: median s (min-max), size" for code in result["codes"])
        + " |",
        "|---|---|" + "---|" * len(result["codes"]),
    ]
    for backend, data in result["backends"].items():
        labels: list[str] = []
        for per_code in data["samples"].values():
            labels += [label for label in per_code if label not in labels]
        for label in labels:
            cells = []
            for code in result["codes"]:
                values = data["samples"][code].get(label)
                if not values:
                    cells.append("–")
                    continue
                cells.append(
                    f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f}), "
                    f"{data['sizes'][code][label] / 1024:,.0f} KiB"
                )
            lines.append(f"| {backend} | {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| backend | tree | part | best s | round trips | statements | rows | store s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, data in result["backends"].items():
        for code, parts in data["probes"].items():
            for part, value in parts.items():
                if not isinstance(value, dict):
                    continue
                store_s = f"{value['store_s']:.3f}" if "store_s" in value else ""
                lines.append(
                    f"| {backend} | {code} | {part} | {value['total_s']:.3f} | "
                    f"{value.get('round_trips', '')} | {value.get('statements', '')} | "
                    f"{value.get('rows', '')} | {store_s} |"
                )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument(
        "--runs",
        type=lambda text: tuple(int(part) for part in text.split("-")),
        default=(5, 20),
        help="ledger rows per job, LOW-HIGH (default 5-20)",
    )
    parser.add_argument("--rounds", type=int, default=7, help="timed requests per subject")
    parser.add_argument("--probe-repeats", type=int, default=3)
    parser.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a source tree (its src directory) to time; repeat to compare (default: this one)",
    )
    parser.add_argument("--burn", type=int, default=0, help="CPU-spinning processes meanwhile")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
