"""Entry point of the ``fleetcron`` command: argument parsing, errors, exit statuses.

A user mistake never produces a traceback: it is one line on stderr naming what is wrong,
and a non-zero exit before any state is touched.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import NoReturn

from fleetcron._log import LOG_FORMATS, JsonFormatter, TextFormatter
from fleetcron._version import __version__
from fleetcron.cli import (
    cancel_cmd,
    doctor_cmd,
    locks_cmd,
    next_cmd,
    scheduler_cmds,
    status_cmd,
    web_cmd,
)
from fleetcron.cli.exitcodes import (
    EXIT_INTERNAL,
    EXIT_STORE_REFUSED,
    EXIT_STORE_UNAVAILABLE,
    EXIT_USAGE,
)
from fleetcron.durations import format_duration, to_micros
from fleetcron.errors import (
    ConfigurationError,
    FleetcronError,
    SchemaError,
    StoreError,
    StoreMissing,
    StoreRefused,
    StoreUnavailable,
)
from fleetcron.job_options import check_job_name
from fleetcron.jobspec import MAX_COUNT
from fleetcron.lock_terms import DEFAULT_LOCK_AT_MOST, LOCK_MODES
from fleetcron.names import resolve_namespace, validate_namespace
from fleetcron.scheduling.retention import COUNT_LIMIT
from fleetcron.stores import (
    open_existing_store,
    open_store,
    read_backend_file,
    resolve_backend,
)
from fleetcron.sync import Fleet

__all__ = ["main"]

# Options whose value may look like an option to argparse ("--timeout -5s" would be
# "expected one argument"); they are glued as "--timeout=-5s" so the value's own
# problem is reported.
_VALUE_OPTIONS = frozenset(
    {
        "--lock-at-most",
        "--lock-at-least",
        "--timeout",
        "--wait",
        "--kill-grace",
        "--grace",
        "--stuck-after",
        "--older-than",
        "--skipped-exit-code",
        "--shutdown-grace",
        "--leader-ttl",
        "--concurrency",
        "--limit",
        "--count",
        "--keep",
    }
)


def _glue_negative_values(arguments: list[str]) -> list[str]:
    glued: list[str] = []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        value = arguments[index + 1] if index + 1 < len(arguments) else ""
        if argument in _VALUE_OPTIONS and value[:1] == "-" and value[1:2].isdigit():
            glued.append(f"{argument}={value}")
            index += 2
        else:
            glued.append(argument)
            index += 1
    return glued


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"fleetcron: error: {message} (see {self.prog} --help)\n")


def _common() -> _Parser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--backend",
        default=argparse.SUPPRESS,
        metavar="URL",
        help="store URL (default: --backend-file, $FLEETCRON_BACKEND, $FLEETCRON_BACKEND_FILE, "
        "the jobs file, else SQLite at the XDG state path); every process on the host can "
        "read a password given here",
    )
    common.add_argument(
        "--backend-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="read the store URL from the first line of PATH (keeps its password off the "
        "command line; chmod 600 it)",
    )
    common.add_argument(
        "--namespace",
        default=argparse.SUPPRESS,
        metavar="NS",
        help="namespace of every name (default: $FLEETCRON_NAMESPACE, else 'default')",
    )
    common.add_argument(
        "-v", "--verbose", action="count", default=argparse.SUPPRESS, help="log more"
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log errors only (e.g. not a skipped `exec --schedule`)",
    )
    common.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS,
        help="text (default) or json: one object per line with every field "
        "(default: $FLEETCRON_LOG_FORMAT, else text)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    """The full ``fleetcron`` argument parser."""
    common = _common()
    parser = _Parser(
        prog="fleetcron",
        description="Run scheduled jobs exactly once across a fleet of replicas.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"fleetcron {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    exec_ = commands.add_parser(
        "exec",
        parents=[common],
        help="run a command only while holding a lease (cross-host flock -n)",
        description="Run COMMAND only if no other replica holds the lease NAME.",
        usage="fleetcron exec NAME [options] -- COMMAND [ARG...]",
    )
    exec_.add_argument("name", metavar="NAME", help="lock name shared by every replica")
    exec_.add_argument(
        "--schedule",
        metavar="CRON",
        help="join the run ledger: run once per slot of CRON across every host and trigger",
    )
    exec_.add_argument("--timezone", metavar="TZ", help="time zone of --schedule (default UTC)")
    exec_.add_argument(
        "--grace",
        metavar="D",
        help="with --schedule: overdue when a slot has no success by slot + D "
        "(default one interval, at least 1m)",
    )
    exec_.add_argument(
        "--stuck-after",
        metavar="D",
        help="with --schedule: a run holding its slot longer than D is stuck "
        "(default 3x the p95 of recent successful runs)",
    )
    exec_.add_argument(
        "--lock-at-most",
        default=DEFAULT_LOCK_AT_MOST,
        metavar="D",
        help="the lease's length: if this host dies, another may run NAME after D; renewed "
        "while the command runs unless --no-keepalive (default %(default)s)",
    )
    exec_.add_argument(
        "--lock-at-least",
        default="0s",
        metavar="D",
        help="hold the lease at least D after the start, so a host whose clock is a little "
        "behind does not run NAME again for the same slot (default %(default)s)",
    )
    exec_.add_argument(
        "--no-keepalive",
        action="store_true",
        help="do not renew; the command is killed when --lock-at-most elapses",
    )
    exec_.add_argument(
        "--lock-mode",
        choices=LOCK_MODES,
        default=LOCK_MODES[0],
        help="lease (default): if this host dies, another runs NAME once --lock-at-most "
        "has passed; advisory (PostgreSQL, not with --schedule): a session advisory lock "
        "too, so another runs NAME the moment this process or its connection dies",
    )
    exec_.add_argument("--timeout", metavar="D", help="kill the command after D (exit 124)")
    exec_.add_argument("--wait", metavar="D", help="wait up to D for the lease instead of skipping")
    exec_.add_argument(
        "--skipped-exit-code", type=int, default=0, metavar="N", help="status when skipped"
    )
    exec_.add_argument(
        "--kill-grace", metavar="D", help="SIGTERM→SIGKILL delay (default min(5s, most/6))"
    )
    exec_.add_argument(
        "--ping-url",
        metavar="URL",
        help="ping the run's start and end to URL, healthchecks.io-style "
        "(/start, success, /fail, /<exit status>, rid=run id)",
    )

    locks = commands.add_parser("locks", parents=[common], help="list leases")
    locks.add_argument("--json", action="store_true", help="machine-readable output")

    _add_prune_parser(commands, common)

    commands.add_parser("migrate", parents=[common], help="create or upgrade the store's schema")
    next_cmd.add_parser(commands, [common])
    status_cmd.add_parser(commands, [common])
    doctor_cmd.add_parser(commands, [common])
    scheduler_cmds.add_parsers(commands, [common])
    cancel_cmd.add_parser(commands, [common])
    web_cmd.add_parser(commands, [common])
    return parser


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _configure_logging(
    verbosity: int, *, daemon: bool = False, log_format: str | None = None, quiet: bool = False
) -> None:
    # A daemon reports every run (info); a one-shot command only what went wrong.
    base = 1 if daemon else 0
    configured = os.environ.get("FLEETCRON_LOG_LEVEL", "").strip().upper()
    if configured and configured not in _LOG_LEVELS:
        raise ConfigurationError(
            f"FLEETCRON_LOG_LEVEL={configured!r} is not a level; use one of "
            f"{', '.join(_LOG_LEVELS)}"
        )
    level = configured or (
        "ERROR"
        if quiet
        else "WARNING"
        if verbosity + base == 0
        else "INFO"
        if verbosity + base == 1
        else "DEBUG"
    )
    chosen = log_format or os.environ.get("FLEETCRON_LOG_FORMAT", "").strip().lower() or "text"
    if chosen not in LOG_FORMATS:
        raise ConfigurationError(
            f"FLEETCRON_LOG_FORMAT={chosen!r} is not a format; use one of {', '.join(LOG_FORMATS)}"
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter(with_time=daemon))
    logger = logging.getLogger("fleetcron")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def _namespace(args: argparse.Namespace) -> str:
    explicit: str | None = getattr(args, "namespace", None)
    if explicit is not None:
        validate_namespace(explicit)  # an explicit --namespace '' is an error, not 'default'
    return resolve_namespace(explicit)


@contextlib.contextmanager
def _fleet(args: argparse.Namespace) -> Iterator[Fleet]:
    """A fleet over the store as it is: ``locks`` and ``prune`` never create one (see
    open_existing_store)."""
    namespace = _namespace(args)
    store = open_existing_store(resolve_backend(getattr(args, "backend", None)))
    try:
        with Fleet(store, namespace=namespace) as fleet:
            yield fleet
    finally:
        store.close()


_PRUNE_DESCRIPTION = """\
Delete rows the store no longer needs, in one of three modes:

  --leases (default)  lease rows not held and unused for --older-than (default 30d)
  --runs              finished runs past their job's retention: finished more than
                      --older-than ago and not among the job's newest --keep (by
                      default each job's own `retention` and `retention_keep`, else
                      30d and 100); --job JOB for one job. Runs queued, running or
                      waiting for a retry always stay.
  --jobs              job rows nobody registered, claimed or finished for
                      --older-than (default 7d), i.e. jobs no replica defines any
                      more, with their finished runs; a job with a queued or running
                      run is kept

--dry-run says what would be deleted (counts per job) and changes nothing."""


def _add_prune_parser(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    prune = commands.add_parser(
        "prune",
        parents=[common],
        help="delete unused lease rows (default), runs past their retention (--runs), or "
        "jobs no replica defines any more (--jobs)",
        description=_PRUNE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = prune.add_mutually_exclusive_group()
    mode.add_argument("--leases", action="store_true", help="prune lease rows (the default)")
    mode.add_argument("--runs", action="store_true", help="prune finished runs past retention")
    mode.add_argument("--jobs", action="store_true", help="prune idle job rows and their runs")
    prune.add_argument(
        "--older-than",
        metavar="D",
        help="the age (default: 30d for leases, 7d for jobs, each job's retention for runs)",
    )
    prune.add_argument(
        "--keep", type=int, metavar="N", help="--runs: keep each job's newest N finished runs"
    )
    prune.add_argument("--job", metavar="JOB", help="--runs: this job only")
    prune.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")


def _prune(args: argparse.Namespace) -> int:
    """``fleetcron prune [--leases | --runs | --jobs]``; every argument is checked before
    the store is opened."""
    mode = "runs" if args.runs else "jobs" if args.jobs else "leases"
    for option, value in (("--keep", args.keep), ("--job", args.job)):
        if value is not None and mode != "runs":
            raise ConfigurationError(f"{option} applies to prune --runs only")
    verb = "would delete" if args.dry_run else "deleted"
    older: str | None = args.older_than
    negative = older is not None and older.strip().startswith("-")
    if mode == "runs":
        if negative:  # 0 is an age here: keep only the newest --keep
            raise ConfigurationError(f"--older-than must not be negative, got {older!r}")
        if older is not None:
            to_micros(older, what="--older-than")
        if args.keep is not None and args.keep < 0:
            raise ConfigurationError(f"--keep must be 0 or more, got {args.keep}")
        if args.keep is not None and args.keep > MAX_COUNT:
            raise ConfigurationError(f"--keep must be at most {MAX_COUNT}, got {args.keep}")
        job = None if args.job is None else check_job_name(args.job, "--job")
        with _fleet(args) as fleet:
            pruned = fleet.prune_runs(
                older_than=older, keep=args.keep, job=job, dry_run=args.dry_run
            )
        total = sum(pruned.values())
        capped = args.dry_run and any(count >= COUNT_LIMIT for count in pruned.values())
        least = "at least " if capped else ""  # a dry run counts up to COUNT_LIMIT per job
        print(f"{verb} {least}{total} run row(s) of {len(pruned)} job(s)")  # noqa: T201
        for name, count in pruned.items():
            more = "at least " if args.dry_run and count >= COUNT_LIMIT else ""
            print(f"  {name}: {more}{count}")  # noqa: T201
        return 0
    older = older or ("7d" if mode == "jobs" else "30d")
    if negative:
        raise ConfigurationError(f"--older-than must not be negative, got {older!r}")
    micros = to_micros(older, what="--older-than")
    if mode == "jobs" and micros == 0:  # for leases, 0 is every lease not held now
        raise ConfigurationError(
            "--older-than must be positive with --jobs: 0 would delete every job that no "
            "replica has registered, claimed or finished this very moment"
        )
    if mode == "jobs":
        with _fleet(args) as fleet:
            found = fleet.prune_jobs(older, dry_run=args.dry_run)
        deleted = [orphan for orphan in found if orphan.deleted]
        print(f"{verb} {len(deleted)} job row(s) idle for more than {older}")  # noqa: T201
        for orphan in found:
            idle = format_duration(orphan.idle_us)
            if orphan.deleted:
                print(f"  {orphan.job}: idle {idle}, with {orphan.runs} run row(s)")  # noqa: T201
            else:
                print(f"  {orphan.job}: idle {idle}, kept: it has a queued or running run")  # noqa: T201
        return 0
    with _fleet(args) as fleet:
        names = fleet.prune(older, dry_run=args.dry_run)
    print(f"{verb} {len(names)} lease row(s)")  # noqa: T201
    for name in names:
        print(f"  {name}")  # noqa: T201
    return 0


def _backend_file(args: argparse.Namespace) -> None:
    """``--backend-file``: its URL stands in for ``--backend``, which wins over it; it
    wins over ``$FLEETCRON_BACKEND`` and the rest (see resolve_backend)."""
    path: str | None = getattr(args, "backend_file", None)
    if path is not None and getattr(args, "backend", None) is None:
        args.backend = read_backend_file(path, source="--backend-file")


def _dispatch(args: argparse.Namespace, command: list[str]) -> int:
    _backend_file(args)
    if args.command == "exec":
        from fleetcron.cli.exec import exec_options, run_exec, run_exec_schedule
        from fleetcron.lock_terms import lease_terms
        from fleetcron.schedules import CronSchedule

        options = exec_options(args, command)
        namespace = _namespace(args)
        url = resolve_backend(getattr(args, "backend", None))
        lease_terms(
            namespace,
            options.name,
            lock_at_most=options.lock_at_most,
            lock_at_least=options.lock_at_least,
            keepalive=options.keepalive,
            mode=options.lock_mode,
        )  # validate before connecting
        if options.lock_mode == "advisory" and url.kind != "postgres":
            from fleetcron.advisory_lease import advisory_refusal

            raise advisory_refusal(url.redacted)
        if args.timezone is not None and args.schedule is None:
            raise ConfigurationError("--timezone needs --schedule")
        if args.schedule is not None:
            schedule = CronSchedule(args.schedule, args.timezone or "UTC")
            store = open_store(url)
            try:
                return run_exec_schedule(store, namespace, options, schedule, url.raw)
            finally:
                store.close()
        with Fleet(open_store(url), namespace=namespace) as fleet:
            return run_exec(fleet, options, url.raw)
    if command:
        raise ConfigurationError(f"unexpected arguments after '--': {' '.join(command)}")
    if args.command == "locks":
        with _fleet(args) as fleet:
            locks_cmd.print_locks(fleet, args.json)
        return 0
    if args.command == "prune":
        return _prune(args)
    if args.command == "migrate":
        url = resolve_backend(getattr(args, "backend", None))
        store = open_store(url, auto_migrate=False)
        try:
            applied = store.migrate()
        finally:
            store.close()
        if applied:
            print(f"applied {', '.join(applied)} to {url.shown}")  # noqa: T201
        else:
            print(f"schema of {url.shown} is up to date")  # noqa: T201
        return 0
    if args.command == "next":
        return next_cmd.run(args)
    if args.command == "run":
        return scheduler_cmds.run_run(args)
    if args.command == "status":
        return status_cmd.run(args)
    if args.command == "doctor":
        return doctor_cmd.run(args)
    if args.command == "web":
        return web_cmd.run(args)
    if args.command == "runs":
        return scheduler_cmds.run_runs(args)
    if args.command == "backfill":
        return scheduler_cmds.run_backfill(args)
    if args.command == "trigger":
        return scheduler_cmds.run_trigger(args)
    if args.command in ("pause", "resume"):
        return scheduler_cmds.run_pause(args, paused=args.command == "pause")
    if args.command == "cancel":
        return cancel_cmd.run(args)
    raise ConfigurationError("no command given (try: fleetcron --help)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in arguments:
        split = arguments.index("--")
        arguments, command = arguments[:split], arguments[split + 1 :]
    arguments = _glue_negative_values(arguments)
    parser = build_parser()
    args = parser.parse_args(arguments)
    try:
        _configure_logging(
            getattr(args, "verbose", 0),
            daemon=args.command in ("run", "web"),
            log_format=getattr(args, "log_format", None),
            quiet=getattr(args, "quiet", False),
        )
        return _dispatch(args, command)
    except ConfigurationError as exc:
        print(f"fleetcron: error: {exc.message}", file=sys.stderr)  # noqa: T201
        return EXIT_USAGE
    except StoreUnavailable as exc:
        print(f"fleetcron: store unavailable: {exc.message}", file=sys.stderr)  # noqa: T201
        return EXIT_STORE_UNAVAILABLE
    except StoreMissing as exc:
        print(f"fleetcron: {exc.message}", file=sys.stderr)  # noqa: T201
        return EXIT_STORE_REFUSED
    except (StoreRefused, SchemaError) as exc:
        print(f"fleetcron: store refused: {exc.message}", file=sys.stderr)  # noqa: T201
        return EXIT_STORE_REFUSED
    except StoreError as exc:
        print(f"fleetcron: store error: {exc.message}", file=sys.stderr)  # noqa: T201
        return EXIT_INTERNAL
    except FleetcronError as exc:
        print(f"fleetcron: error: {exc.message}", file=sys.stderr)  # noqa: T201
        return EXIT_INTERNAL
    except KeyboardInterrupt:
        return 130
    except Exception:
        # A defect of fleetcron: the traceback is for the bug report; the status is not 1,
        # which under `exec` would pass for the command's own.
        traceback.print_exc()
        print("fleetcron: internal error (a bug; please report it)", file=sys.stderr)  # noqa: T201
        return EXIT_INTERNAL


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
