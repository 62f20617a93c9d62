"""``fleetcron run JOBS.toml`` and the ledger commands ``runs``, ``pause``, ``resume``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from fleetcron._log import log, says_progress
from fleetcron._version import __version__
from fleetcron.cli import web_cmd
from fleetcron.cli.elsewhere import elsewhere
from fleetcron.durations import format_duration
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.jobsfile import JobsFile, load_jobs_file
from fleetcron.jobspec import MAX_COUNT
from fleetcron.metrics import Metrics
from fleetcron.models import RunRecord, display_holder, micros_to_datetime
from fleetcron.names import NAMESPACE_ENV, validate_job_name, validate_namespace
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.schedules import from_datetime, iso_utc, schedule_from_definition
from fleetcron.stores import StoreURL, open_async_store, open_existing_store, resolve_backend

__all__ = [
    "BACKFILL_MAX_SLOTS",
    "add_parsers",
    "run_backfill",
    "run_pause",
    "run_run",
    "run_runs",
    "run_trigger",
]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)

BACKFILL_MAX_SLOTS = 100_000
"""The most slots one ``fleetcron backfill`` may queue. Its rows are written in one
transaction (one script on Redis), all or none, so they are held and sent at once; 100,000
take 0.5 to 1.6 s on each backend (a Redis server spends 1 s of it in the script, serving
no one else). A longer range takes several backfills."""


def add_parsers(
    subparsers: argparse._SubParsersAction[_Parser], parents: Sequence[_Parser]
) -> None:
    """Add ``run``, ``runs``, ``pause`` and ``resume``."""
    run = subparsers.add_parser(
        "run",
        parents=list(parents),
        help="run the jobs of a jobs file (every replica runs the same command)",
        description="Run the jobs of JOBS.toml; each slot runs once across every replica.",
    )
    run.add_argument("jobs_file", metavar="JOBS.toml")
    run.add_argument("--mode", choices=("claim", "leader"), help="default: the file's, or claim")
    run.add_argument(
        "--concurrency",
        type=int,
        default=16,
        metavar="N",
        help="runs in flight on this replica (default 16)",
    )
    run.add_argument(
        "--shutdown-grace", default="30s", metavar="D", help="time running jobs get on SIGTERM"
    )
    run.add_argument(
        "--leader-ttl",
        default=None,
        metavar="D",
        help="leader mode only: lease length (default 15s); a dead leader is replaced within "
        "about this long",
    )

    run.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (':9100' is every interface)",
    )
    run.add_argument(
        "--web",
        metavar="HOST:PORT",
        help="serve the dashboard at http://HOST:PORT/ beside the jobs (actions need "
        "$FLEETCRON_WEB_TOKEN; see `fleetcron web`)",
    )

    runs = subparsers.add_parser("runs", parents=list(parents), help="show the run ledger")
    runs.add_argument("job", nargs="?", metavar="JOB")
    runs.add_argument("--limit", type=int, default=20, metavar="N")
    runs.add_argument("--json", action="store_true", help="machine-readable output")

    trigger = subparsers.add_parser(
        "trigger", parents=list(parents), help="run a job now, once, on one replica"
    )
    trigger.add_argument("job", metavar="JOB")

    backfill = subparsers.add_parser(
        "backfill",
        parents=list(parents),
        help="queue the slots of a past time range; the replicas run them one by one",
    )
    backfill.add_argument("job", metavar="JOB")
    backfill.add_argument("--from", dest="start", required=True, metavar="TIME")
    backfill.add_argument("--to", dest="end", required=True, metavar="TIME")
    backfill.add_argument(
        "--limit",
        type=int,
        default=1000,
        metavar="N",
        help=f"refuse a range of more than N slots (default 1000, at most {BACKFILL_MAX_SLOTS})",
    )

    for verb in ("pause", "resume"):
        command = subparsers.add_parser(
            verb, parents=list(parents), help=f"{verb} a job on every replica"
        )
        command.add_argument("job", metavar="JOB")


_DEFAULT_LEADER_TTL = "15s"


def serve_metrics(where: str, metrics: Metrics) -> WSGIServer:
    """Serve ``metrics`` at ``http://HOST:PORT/metrics`` in a daemon thread; a bad
    address or a port in use is refused before anything else starts."""
    host, sep, port_text = where.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"  # ':PORT' means every interface, as in Go tools
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigurationError(
            f"--metrics must be HOST:PORT (e.g. 127.0.0.1:9100), not {where!r}"
        )
    try:
        server, _thread = start_http_server(int(port_text), host, registry=metrics.registry)
    except OSError as exc:
        raise ConfigurationError(
            f"--metrics {where}: cannot listen there: {exc.strerror or exc}"
        ) from None
    log.info(
        "metrics at http://%s:%s/metrics",
        host,
        port_text,
        extra={"action": "metrics_serving", "address": where},
    )
    return server


def _job_arg(args: argparse.Namespace) -> str | None:
    """The JOB argument, checked like every name before anything reads the store."""
    job: str | None = args.job
    return None if job is None else validate_job_name(job)


def _namespace(args: argparse.Namespace, configured: str | None) -> str:
    explicit = getattr(args, "namespace", None)
    if explicit is not None:
        return validate_namespace(explicit)
    return validate_namespace(os.environ.get(NAMESPACE_ENV) or configured or "default")


def run_run(args: argparse.Namespace) -> int:
    """``fleetcron run``: load and check everything, then run until SIGTERM/SIGINT."""
    from fleetcron.durations import to_micros

    began = time.monotonic()
    jobs_file = load_jobs_file(args.jobs_file)
    _log_read(jobs_file, time.monotonic() - began)
    if args.concurrency < 1:
        raise ConfigurationError(f"--concurrency must be at least 1, got {args.concurrency}")
    grace = to_micros(args.shutdown_grace, what="--shutdown-grace")
    if grace < 0:
        raise ConfigurationError(f"--shutdown-grace must not be negative: {args.shutdown_grace!r}")
    mode = args.mode or jobs_file.mode or "claim"
    if args.leader_ttl is not None and mode != "leader":
        raise ConfigurationError(
            f"--leader-ttl applies to leader mode only; this run is in {mode} mode "
            '(set --mode leader or mode = "leader" in the jobs file)'
        )
    leader_ttl = to_micros(args.leader_ttl or _DEFAULT_LEADER_TTL, what="--leader-ttl")
    if leader_ttl < 1_000_000:
        raise ConfigurationError(f"--leader-ttl must be at least 1s, got {args.leader_ttl!r}")
    url = resolve_backend(getattr(args, "backend", None), jobs_file.backend)
    options = SchedulerOptions(
        leader_ttl_us=leader_ttl,
        namespace=_namespace(args, jobs_file.namespace),
        mode=mode,
        concurrency=args.concurrency,
        shutdown_grace_s=grace / 1e6,
        backend_url=url.raw,
        alert_webhook=jobs_file.alert_webhook,
    )
    web = web_cmd.listen(args.web, "--web") if args.web else None  # before anything starts
    metrics = Metrics()
    try:
        server = serve_metrics(args.metrics, metrics) if args.metrics else None
    except ConfigurationError:
        if web is not None:
            web.close()
        raise

    served = []
    if server is not None:
        host, port = str(server.server_address[0]), server.server_address[1]
        served.append(f"metrics at http://{host}:{port}/metrics")
    if web is not None:
        from fleetcron.web.server import address_url

        served.append(f"dashboard at {address_url(web)}")

    async def main() -> None:
        store = await open_async_store(url)
        try:
            scheduler = AsyncScheduler(
                store, jobs_file.jobs, options, metrics=metrics, queues=jobs_file.queues
            )
            # Said once the jobs are registered and planned: a replica of many jobs says
            # what it is doing until then (jobs_read, jobs_registered).
            started = asyncio.create_task(
                _log_when_started(
                    scheduler,
                    # host:pid only: the token after it is the holder's secret
                    lambda: _log_start(
                        url, options, jobs_file, display_holder(scheduler.holder), served
                    ),
                )
            )
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, scheduler.stop)
            reloads: set[asyncio.Task[None]] = set()

            def on_hangup() -> None:
                task = loop.create_task(reload_jobs(scheduler, jobs_file))
                reloads.add(task)
                task.add_done_callback(reloads.discard)

            loop.add_signal_handler(signal.SIGHUP, on_hangup)
            try:
                if web is None:
                    await scheduler.run()
                else:
                    await web_cmd.beside(scheduler.run, web, url, store, options.namespace)
            finally:
                started.cancel()
        finally:
            await store.close()

    try:
        asyncio.run(main())
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if web is not None:
            web.close()
    return 0


async def _log_when_started(scheduler: AsyncScheduler, say: Callable[[], None]) -> None:
    await scheduler.signals.started.wait()
    say()


def _log_read(jobs: JobsFile, elapsed_s: float) -> None:
    """A line for a jobs file of many jobs, or one slow to read: start-up has begun."""
    if says_progress(len(jobs.jobs), elapsed_s):
        log.info(
            "read %s job(s) of %s in %.1f s; registering them",
            f"{len(jobs.jobs):,}",
            jobs.path or "the jobs file",
            elapsed_s,
            extra={"action": "jobs_read", "jobs": len(jobs.jobs), "seconds": round(elapsed_s, 3)},
        )


def _log_start(
    store: StoreURL, options: SchedulerOptions, jobs: JobsFile, replica: str, served: list[str]
) -> None:
    """One line that says what this replica runs, where (a SQLite path relative to the
    working directory with the file it names), as whom, and what it serves, once its jobs
    are registered and planned."""
    log.info(
        "fleetcron %s: %d job(s) and %d queue(s) of %s in namespace %r on %s, %s mode, "
        "replica %s%s",
        __version__,
        len(jobs.jobs),
        len(jobs.queues),
        jobs.path or "the jobs file",
        options.namespace,
        store.shown,
        options.mode,
        replica,
        "".join(f", {what}" for what in served),
        extra={
            "action": "replica_starting",
            "store": store.redacted,
            "namespace": options.namespace,
            "mode": options.mode,
            "jobs": len(jobs.jobs),
            "queues": len(jobs.queues),
            "replica": replica,
        },
    )


async def reload_jobs(scheduler: AsyncScheduler, loaded: JobsFile) -> None:
    """SIGHUP: read the jobs file again and hand the jobs to the running scheduler. A file
    that does not load is refused with its message, and the jobs in place keep running;
    settings that need a restart (backend, namespace, mode) are said, not applied."""
    assert loaded.path is not None
    try:
        fresh = await asyncio.to_thread(load_jobs_file, str(loaded.path))
    except ConfigurationError as exc:
        log.error(
            "reload refused, the jobs in place keep running: %s",
            exc.message,
            extra={"action": "jobs_reload_refused"},
        )
        return
    if _queues_of(fresh) != _queues_of(loaded):
        log.warning(
            "reload: the jobs file's [queues] changed; the queue workers change at the next start",
            extra={"action": "jobs_reload_partial", "setting": "queues"},
        )
    for key in ("backend", "namespace", "mode"):
        if getattr(fresh, key) != getattr(loaded, key):
            log.warning(
                "reload: the jobs file's %s changed; it takes effect at the next start",
                key,
                extra={"action": "jobs_reload_partial", "setting": key},
            )
    try:
        await scheduler.reload(fresh.jobs)
    except StoreError as exc:
        log.error(
            "reload could not register the jobs (%s); the next SIGHUP tries again",
            exc,
            extra={"action": "jobs_reload_refused"},
        )


def _queues_of(jobs_file: JobsFile) -> list[tuple[object, ...]]:
    return [
        (q.name, q.reference, q.batch, q.workers, q.idle_us, q.settings) for q in jobs_file.queues
    ]


def _iso(micros: int | None) -> str:
    if micros is None:
        return "-"
    return micros_to_datetime(micros).isoformat(timespec="seconds").replace("+00:00", "Z")


def _row(run: RunRecord) -> dict[str, object]:
    host, _, _token = run.holder.rpartition(":")
    duration = None
    if run.started_us is not None:
        end = run.finished_us if run.finished_us is not None else run.now_us
        duration = round((end - run.started_us) / 1e6, 3)
    return {
        "job": run.job,
        # To the microsecond when not whole: two triggers of one second are two slots.
        "slot": iso_utc(run.slot_us),
        "state": run.state,
        "attempt": run.attempt,
        "fence": run.fence,
        "holder": host or None,
        "trigger": run.trigger,
        "started": _iso(run.started_us) if run.started_us else None,
        "duration_s": duration,
        "exit_code": run.exit_code,
        "error": run.error,
    }


def _limit_option(limit: int) -> None:
    """Refuse a ``runs --limit`` outside 1 to :data:`~fleetcron.jobspec.MAX_COUNT` before
    the store is opened: argparse takes any integer, and a database's 64-bit argument (or
    a Redis script's double) would fail on a larger one with the driver's error."""
    if not 1 <= limit <= MAX_COUNT:
        raise ConfigurationError(f"--limit must be 1 to {MAX_COUNT}, got {limit}")


def run_runs(args: argparse.Namespace) -> int:
    """``fleetcron runs [JOB]``: newest slots first."""
    _limit_option(args.limit)
    url = resolve_backend(getattr(args, "backend", None))
    namespace = _namespace(args, None)
    args.job = _job_arg(args)
    chosen = getattr(args, "namespace", None) is not None or bool(os.environ.get(NAMESPACE_ENV))
    store = open_existing_store(url)
    try:
        runs = store.run(store.ops.run_list(namespace, args.job, args.limit))
        # The namespace is named, and where the jobs are when it holds none (a jobs file's
        # [fleetcron] namespace is not the default the command reads).
        hint = "" if runs or args.json else elsewhere(store, namespace, chosen)
    finally:
        store.close()
    rows = [_row(run) for run in runs]
    if args.json:
        print(json.dumps(rows, indent=2))  # noqa: T201
        return 0
    if not rows:
        print(f"no runs in namespace {namespace!r} ({hint})")  # noqa: T201
        return 0
    header = ("JOB", "SLOT", "STATE", "ATTEMPT", "FENCE", "HOLDER", "DURATION", "EXIT", "ERROR")
    table = [header]
    for row in rows:
        duration = row["duration_s"]
        table.append(
            (
                str(row["job"]),
                str(row["slot"]),
                str(row["state"]),
                str(row["attempt"]),
                str(row["fence"]),
                str(row["holder"] or "-"),
                format_duration(round(float(duration) * 1e6)) if duration is not None else "-",  # type: ignore[arg-type]
                "-" if row["exit_code"] is None else str(row["exit_code"]),
                str(row["error"] or ""),
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        print(text.rstrip())  # noqa: T201
    return 0


def run_pause(args: argparse.Namespace, paused: bool) -> int:
    """``fleetcron pause JOB`` / ``resume JOB``: persisted in the store for every replica.

    A job no replica has registered yet may be paused ahead of its deploy: it starts
    paused, and a note says the job is not defined yet. Resuming such a pause takes it
    back (the row held nothing else); resuming a job the store has no row of is an error.
    """
    url = resolve_backend(getattr(args, "backend", None))
    namespace = _namespace(args, None)
    args.job = _job_arg(args)
    store = open_existing_store(url)
    try:
        known = store.run(store.ops.job_set_paused(namespace, args.job, paused))
        row = store.run(store.ops.job_get(namespace, args.job)) if known else None
    finally:
        store.close()
    if not known:
        raise ConfigurationError(
            f"no job {args.job!r} in namespace {namespace!r} (jobs register when a replica runs)"
        )
    print(f"{args.job}: {'paused' if paused else 'resumed'}")  # noqa: T201
    undefined = f"no job named {args.job} is defined"
    if row is None:  # resumed: the row held nothing but a pause recorded ahead
        note = f"{undefined} in namespace {namespace!r}; the pause recorded ahead of it is removed"
    elif paused and row.fingerprint == "" and row.definition in ("", "{}"):
        note = (
            f"{undefined} yet in namespace {namespace!r}; it will start paused when a replica "
            "registers it"
        )
    else:
        return 0
    print(f"note: {note}")  # noqa: T201
    return 0


def run_trigger(args: argparse.Namespace) -> int:
    """``fleetcron trigger JOB``: queue a run at the store's now; a replica claims it.

    Works while the job is paused (like Temporal's trigger). The running replicas pick
    the queued slot up within a couple of seconds.
    """
    url = resolve_backend(getattr(args, "backend", None))
    namespace = _namespace(args, None)
    args.job = _job_arg(args)
    store = open_existing_store(url)
    try:
        ledger = store.ops
        if store.run(ledger.job_get(namespace, args.job)) is None:
            raise ConfigurationError(
                f"no job {args.job!r} in namespace {namespace!r} "
                "(jobs register when a replica runs)"
            )
        slot = store.run(ledger.store_now())
        store.run(ledger.run_record(namespace, args.job, slot, "queued", None, "manual"))
    finally:
        store.close()
    print(f"{args.job}: queued a run for {iso_utc(slot)}")  # noqa: T201
    return 0


def _moment(text: str, option: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigurationError(f"{option}: {text!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a naive time is UTC, as slots are
    return from_datetime(moment)


def run_backfill(args: argparse.Namespace) -> int:
    """``fleetcron backfill JOB --from T --to T``: queue every slot of the job's schedule
    in [from, to] that has no ledger row yet, in one step (all of them or none); running
    replicas claim them in order.

    A range of more than ``--limit`` slots (at most :data:`BACKFILL_MAX_SLOTS`) is refused
    before anything is written: the schedule is read up to one slot past the limit, so
    what the command holds is bounded by the limit whatever the range.
    """
    start, end = _moment(args.start, "--from"), _moment(args.end, "--to")
    if end < start:
        raise ConfigurationError("--to is before --from")
    if not 1 <= args.limit <= BACKFILL_MAX_SLOTS:
        raise ConfigurationError(
            f"--limit must be between 1 and {BACKFILL_MAX_SLOTS} (one backfill is written in "
            f"one transaction; split a longer range into several), got {args.limit}"
        )
    url = resolve_backend(getattr(args, "backend", None))
    namespace = _namespace(args, None)
    args.job = _job_arg(args)
    store = open_existing_store(url)
    try:
        ledger = store.ops
        job = store.run(ledger.job_get(namespace, args.job))
        if job is None or job.definition in ("", "{}"):
            raise ConfigurationError(
                f"no registered job {args.job!r} in namespace {namespace!r} "
                "(jobs register when a replica runs)"
            )
        schedule = schedule_from_definition(json.loads(job.definition)["schedule"])
        now = store.run(ledger.store_now())
        if end > now:
            raise ConfigurationError("--to is in the future: the scheduler runs those slots")
        try:
            slots = schedule.slots_between(start - 1, end, limit=args.limit + 1)
        except OverflowError:
            raise ConfigurationError(
                "--from: the range runs past the calendar's range (years 1 to 9999)"
            ) from None
        if len(slots) > args.limit:
            wider = (
                f"raise --limit (at most {BACKFILL_MAX_SLOTS})"
                if args.limit < BACKFILL_MAX_SLOTS
                else "split it into several backfills"
            )
            raise ConfigurationError(
                f"the range holds more than {args.limit} slots; nothing was queued: "
                f"narrow it or {wider}"
            )
        queued = store.run(ledger.run_backfill(namespace, args.job, slots))
    finally:
        store.close()
    print(  # noqa: T201
        f"{args.job}: queued {queued} of {len(slots)} slot(s) from {_iso(start)} to "
        f"{_iso(end)}; {len(slots) - queued} already have a ledger row"
    )
    return 0
