"""Job definitions: the jobs file (TOML) and their validation.

A jobs file has an optional ``[fleetcron]`` table and one ``[jobs.NAME]`` table per job::

    [fleetcron]
    backend = "postgresql://app@db/app"   # optional; CLI flag and $FLEETCRON_BACKEND win
    namespace = "prod"                     # optional
    mode = "claim"                         # optional: claim | leader
    retention = "30d"                      # optional: every job's, unless it sets its own
    retention_keep = 100                   # optional: likewise

    [jobs.invoice-sweep]
    schedule = "*/5 * * * *"           # or: every = "30s" / at = "2025-01-01T09:00:00+01:00"
    timezone = "Europe/Berlin"
    command = ["/opt/app/bin/invoice-export", "--since", "yesterday"]  # or: call = "app.jobs:sweep"

Keys of a job and their defaults (:data:`DEFAULTS`):

============== =========== ===========================================================
key            default     meaning
============== =========== ===========================================================
schedule                   5-field cron expression (exactly one of schedule/every/at)
every                      interval (at least 100ms), slots aligned to the Unix epoch
at                         ISO 8601 date and time; with an offset, or naive in ``timezone``
timezone       ``UTC``     IANA zone for ``schedule`` and a naive ``at``
command                    argv list (exactly one of command/call); run without a shell;
                           an element holding a NUL character is refused (no program
                           can be given one)
call                       ``module:function``; imported when the file is loaded
lock_at_most   ``10m``     lease length: the ceiling if the holder dies
lock_at_least  ``0s``      the lease stays held this long after the run (ShedLock)
timeout        none        the run is cancelled after this long
overlap        ``skip``    skip | buffer_one | allow | cancel_other
catchup        ``latest``  skip | latest | all: what to do with slots missed while down
catchup_window ``1h``      how far back missed slots are considered
max_catchup    ``100``     at most this many missed slots are run (catchup = all)
retries        ``0``       extra attempts after a failure
retry_backoff  ``30s``     delay before a retry
jitter         ``0s``      deterministic start delay per (job, slot), at most this long
grace          none        overdue (alert) when no success by slot + grace
stuck_after    none        a run holding its slot longer is *stuck* (none: 3 × recent p95)
ping_url       none        healthchecks-style URL
keepalive      ``true``    renew the lease while the job runs; false = killed at lock_at_most
isolate        ``none``    ``process``: run a ``call`` job in a child process, killable
retention      ``30d``     finished runs older than this are deleted from the ledger…
retention_keep ``100``     …except the job's newest this many (whatever their age)
============== =========== ===========================================================

``isolate``: a sync ``call`` function runs in a worker thread, which cannot be killed: when
its run is cancelled it is told (``ctx.cancelled``) and abandoned, and the replica starts
no other run of the job until it returns. With ``isolate = "process"`` it runs in a child
process of its own, stopped like a command (SIGTERM, then SIGKILL by the lease's deadline).

In the file, durations are strings with a unit (``"500ms"``, ``"90s"``, ``"1h30m"``); from
Python they may also be seconds or a :class:`~datetime.timedelta`.

``retention`` and ``retention_keep`` are two flat keys, not one table, like every other
pair of related keys (``retries``/``retry_backoff``, ``catchup``/``catchup_window``): a job
sets either one alone and takes the other from the ``[fleetcron]`` table (or the default),
with no merge rules for nested tables, and ``@fleet.job(retention="7d",
retention_keep=10)`` reads the same as the file. Set in ``[fleetcron]``, they are every
job's unless the job sets its own; a job's value, from either place, is part of its
definition (so replicas compare it), a job that sets neither keeps the fingerprint it had.
The replica that watches the namespace applies each job's rule every 10 minutes
(:mod:`fleetcron.scheduling.retention`); ``fleetcron prune --runs`` applies it by hand.

``[queues.NAME]`` tables declare queue workers that ``fleetcron run`` runs beside the
scheduler (:mod:`fleetcron.scheduling.queues` lists their keys); a file may hold jobs,
queues or both.

``call`` modules are imported when the file is loaded, with the jobs file's directory
placed first on ``sys.path`` for the duration of the import, so a module next to the jobs
file is found (``call = "jobs_demo:tick"`` for ``jobs_demo.py`` beside ``jobs.toml``).
Modules already imported are reused.

Every mistake is a :class:`ConfigurationError` with a one-line message naming the file,
the job and the key, e.g. ``jobs.toml: job 'invoice-sweep': key 'timezone': unknown time
zone 'Europe/Berln'``, raised before anything touches a store.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args

from fleetcron.errors import ConfigurationError
from fleetcron.job_options import JobBuilder, check_job_name
from fleetcron.jobspec import JobSpec, one_line, unique_jobs
from fleetcron.names import validate_namespace
from fleetcron.scheduling.queues import QueueSpec, load_queue_specs
from fleetcron.toml_parts import Unsplittable, parts

__all__ = ["MAX_JOBS_FILE_BYTES", "MODES", "JobsFile", "Mode", "load_jobs_file"]

Mode = Literal["claim", "leader"]
MODES: tuple[Mode, ...] = get_args(Mode)

_SETTINGS_KEYS = frozenset(
    {"backend", "namespace", "mode", "retention", "retention_keep", "alert_webhook"}
)
# [fleetcron] keys that are every job's default (a job's own value wins).
_RETENTION_KEYS = ("retention", "retention_keep", "alert_webhook")
MAX_JOBS_FILE_BYTES = 16 * 1_048_576  # far above 10,000 jobs; a runaway file is refused
_NO_JOBS = "{where}: no jobs: add a [jobs.NAME] table per job (or [queues.NAME] workers)"
_DUPLICATE_JOB = re.compile(r"Cannot declare \('jobs', (['\"])(.*)\1\) twice (\(.*\))")


@dataclass(frozen=True, kw_only=True)
class JobsFile:
    """A loaded jobs file: the ``[fleetcron]`` settings and the jobs, in file order.

    ``retention_us`` and ``retention_keep`` are the table's (``None``: not given); they are
    already in each job that does not set its own (:attr:`JobSpec.retention`)."""

    jobs: tuple[JobSpec, ...]
    queues: tuple[QueueSpec, ...] = ()
    path: Path | None = None
    backend: str | None = None
    namespace: str | None = None
    mode: Mode | None = None
    retention_us: int | None = None
    retention_keep: int | None = None
    alert_webhook: str | None = None  # also in each job that does not set its own

    def __post_init__(self) -> None:
        unique_jobs(self.jobs, where=str(self.path) if self.path else "jobs")

    def job(self, name: str) -> JobSpec:
        """The job called ``name``; :class:`KeyError` when there is none."""
        for spec in self.jobs:
            if spec.name == name:
                return spec
        raise KeyError(name)


@dataclass(frozen=True, kw_only=True)
class _Settings:
    backend: str | None
    namespace: str | None
    mode: Mode | None
    retention_us: int | None
    retention_keep: int | None
    job_defaults: dict[str, object]  # the table's retention keys as written (validated)

    def job_options(self, options: dict[str, object]) -> dict[str, object]:
        """A job's options, with the table's retention keys it does not set itself."""
        return {**self.job_defaults, **options}


class _TableChecker(JobBuilder):
    """The job keys' validation applied to the ``[fleetcron]`` table's job defaults."""

    def fail(self, key: str, problem: str) -> NoReturn:
        raise ConfigurationError(one_line(f"{self.where}: [fleetcron]: key {key!r}: {problem}"))


def _settings(table: object, where: str) -> _Settings:
    if not isinstance(table, dict):
        raise ConfigurationError(f"{where}: 'fleetcron' must be a table ([fleetcron])")
    unknown = sorted(set(table) - _SETTINGS_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where}: [fleetcron]: key {unknown[0]!r}: unknown key; "
            f"known keys: {', '.join(sorted(_SETTINGS_KEYS))}"
        )
    backend = table.get("backend")
    if backend is not None and (not isinstance(backend, str) or not backend.strip()):
        raise ConfigurationError(f"{where}: [fleetcron]: key 'backend': must be a store URL")
    namespace = table.get("namespace")
    if namespace is not None:
        try:
            namespace = validate_namespace(namespace)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{where}: [fleetcron]: key 'namespace': {exc.message}"
            ) from None
    mode_value = table.get("mode")
    mode: Mode | None = None
    if mode_value is not None:
        for option in MODES:
            if mode_value == option:
                mode = option
        if mode is None:
            raise ConfigurationError(
                f"{where}: [fleetcron]: key 'mode': unknown value {mode_value!r} "
                f"(expected one of: {', '.join(MODES)})"
            )
    job_defaults = {key: table[key] for key in _RETENTION_KEYS if key in table}
    checker = _TableChecker(
        "[fleetcron]",
        job_defaults,
        where=where,
        from_toml=True,
        base_dir=None,
        now_us=None,
    )
    retention_us, retention_keep = checker.retention()
    checker.ping_url("alert_webhook")  # refused here, naming [fleetcron], when bad
    return _Settings(
        backend=backend,
        namespace=namespace,
        mode=mode,
        retention_us=retention_us,
        retention_keep=retention_keep,
        job_defaults=job_defaults,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _toml_error(where: str, exc: tomllib.TOMLDecodeError) -> str:
    duplicate = _DUPLICATE_JOB.fullmatch(str(exc))
    if duplicate:
        return f"{where}: job {duplicate.group(2)!r} is defined twice {duplicate.group(3)}"
    return one_line(f"{where}: invalid TOML: {exc}")


def _read_limited(file: Path, where: str) -> bytes:
    """The file's bytes, refusing what is not a regular file (a FIFO would block, a device
    like /dev/zero never ends) or is larger than :data:`MAX_JOBS_FILE_BYTES`."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer before we can refuse it.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigurationError(f"{where}: jobs file not found") from None
    except IsADirectoryError:
        raise ConfigurationError(f"{where}: is a directory, not a jobs file") from None
    except OSError as exc:
        raise ConfigurationError(f"{where}: cannot read jobs file: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise ConfigurationError(f"{where}: is a directory, not a jobs file")
        raise ConfigurationError(
            f"{where}: not a regular file (a pipe, socket or device); a jobs file must be a file"
        )
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read(MAX_JOBS_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigurationError(f"{where}: cannot read jobs file: {exc.strerror}") from None
    if len(raw) > MAX_JOBS_FILE_BYTES:
        raise ConfigurationError(
            f"{where}: larger than {MAX_JOBS_FILE_BYTES // 1_048_576} MiB; is this the jobs file?"
        )
    return raw


def load_jobs_file(path: str | Path, *, now_us: int | None = None) -> JobsFile:
    """Read and validate a jobs file; every problem is a one-line :class:`ConfigurationError`.

    ``call`` modules are imported with the file's directory first on ``sys.path``.
    ``now_us`` anchors the year over which the shortest cron interval is measured.

    The file is parsed a few hundred jobs at a time (:mod:`fleetcron.toml_parts`), each
    part's jobs built before the next part is parsed, so a file of 100,000 jobs never
    holds its whole parsed document; equal values of different jobs (durations, time
    zones, schedules, command arguments) are one object.
    """
    where = str(path)
    file = Path(path)
    try:
        text = _read_limited(file, where).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    try:
        return _load(parts(text, "jobs"), file, now_us)
    except (Unsplittable, ConfigurationError):
        # A mistake is told as the whole document tells it: the first one of its checks
        # (a TOML error anywhere before a bad job), not the first part's.
        return _load(iter([_whole(text, where)]), file, now_us)


def _whole(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(_toml_error(where, exc)) from None


def _load(documents: Iterator[dict[str, Any]], file: Path, now_us: int | None) -> JobsFile:
    """The jobs file of ``documents``: the whole document, or its parts in order (the
    first one holding the ``[fleetcron]`` table); :class:`Unsplittable` when a later part
    holds what must come first."""
    where = str(file)
    head = next(documents)
    _check_keys(head, where)
    settings = _settings(head.get("fleetcron", {}), where)
    base_dir = file.resolve().parent
    queues = load_queue_specs(head.get("queues", {}), where=where, base_dir=base_dir)
    later_queues: dict[str, object] = {}
    shared: dict[type, dict[Any, Any]] = {}
    specs: list[JobSpec] = []
    for document in itertools.chain([head], documents):
        if document is not head:
            if not set(document) <= {"jobs", "queues"}:
                raise Unsplittable("[fleetcron] or an unknown table after the first jobs")
            later_queues.update(document.get("queues", {}))
        jobs_table = document.get("jobs", {})
        if not isinstance(jobs_table, dict):
            raise ConfigurationError(_NO_JOBS.format(where=where))
        for name, options in jobs_table.items():
            checked = check_job_name(name, where)
            if not isinstance(options, dict):
                raise ConfigurationError(f"{where}: job {name!r}: must be a table [jobs.{name}]")
            builder = JobBuilder(
                checked,
                settings.job_options(options),
                where=where,
                from_toml=True,
                base_dir=base_dir,
                now_us=now_us,
                shared=shared,
            )
            specs.append(builder.build())
    if later_queues:
        queues += load_queue_specs(later_queues, where=where, base_dir=base_dir)
    if not (specs or queues):
        raise ConfigurationError(_NO_JOBS.format(where=where))
    return JobsFile(
        jobs=unique_jobs(specs, where=where),
        queues=queues,
        path=file,
        backend=settings.backend,
        namespace=settings.namespace,
        mode=settings.mode,
        retention_us=settings.retention_us,
        retention_keep=settings.retention_keep,
        alert_webhook=_text(settings.job_defaults.get("alert_webhook")),
    )


def _check_keys(document: dict[str, Any], where: str) -> None:
    for key in document:
        if key not in ("fleetcron", "jobs", "queues"):
            raise ConfigurationError(
                f"{where}: unknown top-level key {key!r} "
                "(expected a [fleetcron] table, [jobs.NAME] and [queues.NAME] tables)"
            )
