"""``fleetcron doctor [JOBS.toml] [--json]``: check a deployment, one finding per line.

Each line is ``ok``, ``warn`` or ``fail``, what was checked and what was found; a finding
with advice has it on the next line, indented. Exits 0 when no check failed, 1 when one
did (a store that is not there is one: the doctor never creates it), 75 when the store
cannot be reached, 2 for bad usage (a jobs file ``fleetcron run`` could not even read).
The checks are in :mod:`fleetcron.doctor`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fleetcron.cli.exitcodes import EXIT_UNHEALTHY
from fleetcron.doctor import (
    LEVELS,
    Finding,
    definition_failures,
    diagnose,
    gather,
    missing_store,
)
from fleetcron.errors import ConfigurationError, StoreMissing
from fleetcron.job_options import JobBuilder, check_job_name
from fleetcron.jobsfile import _read_limited, _settings, load_jobs_file
from fleetcron.jobspec import JobSpec, unique_jobs
from fleetcron.names import NAMESPACE_ENV, validate_namespace
from fleetcron.stores import StoreURL, open_store, resolve_backend

__all__ = ["CheckedFile", "add_parser", "load_jobs", "render", "run"]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)

# Keys whose combinations with others `fleetcron run` refuses and the doctor reports as
# findings (each value alone is still checked as run checks it).
_CROSS_CHECKED = ("lock_at_least", "jitter", "keepalive")
_ADVICE_INDENT = " " * 6


def add_parser(commands: argparse._SubParsersAction[_Parser], parents: Sequence[_Parser]) -> None:
    """Declare ``doctor``."""
    doctor = commands.add_parser(
        "doctor",
        parents=list(parents),
        help="check a deployment: store, schema, clock, jobs, replicas",
        description="Check the store, its schema and clock, the jobs (of JOBS.toml, else "
        "the ones the replicas registered) and the replicas; one finding per line. "
        "Exit 0: nothing failed; 1: a check failed; 75: the store is unreachable.",
    )
    doctor.add_argument(
        "jobs_file",
        nargs="?",
        metavar="JOBS.toml",
        help="check these jobs (default: the definitions registered in the store)",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")


@dataclass(frozen=True, kw_only=True)
class CheckedFile:
    """The jobs of a jobs file for the doctor, with its ``backend`` and ``namespace``.
    ``exact``: loaded as ``fleetcron run`` loads it (else relaxed: see
    :func:`load_jobs`), so each job's fingerprint is the one a replica registers."""

    specs: tuple[JobSpec, ...]
    backend: str | None
    namespace: str | None
    exact: bool


def load_jobs(path: str) -> CheckedFile:
    """The jobs file at ``path``, as ``fleetcron run`` loads it.

    When ``run`` would refuse it only for combinations of keys the doctor reports itself
    (a ``lock_at_least`` not shorter than the schedule's interval, a ``jitter`` as long
    as it, a ``timeout`` past ``lock_at_most`` without keepalive), the jobs are loaded
    without those cross-checks instead, for the doctor to report with everything else.
    Any other problem is ``run``'s :class:`ConfigurationError` (exit 2).
    """
    try:
        loaded = load_jobs_file(path)
    except ConfigurationError as refused:
        relaxed = _relaxed(path)
        if relaxed is None:
            raise refused from None
        return relaxed
    return CheckedFile(
        specs=loaded.jobs, backend=loaded.backend, namespace=loaded.namespace, exact=True
    )


def _relaxed(path: str) -> CheckedFile | None:
    """The jobs of ``path`` built without the cross-checks of :data:`_CROSS_CHECKED`; or
    ``None`` unless some job is refused on its own and each such job has a definition
    failure the doctor reports (anything else — TOML, settings, a bad value, a job
    defined twice — is run's to say)."""
    try:
        document = tomllib.loads(_read_limited(Path(path), path).decode("utf-8"))
        settings, table = document.get("fleetcron", {}), document.get("jobs")
        if set(document) - {"fleetcron", "jobs"} or not isinstance(table, dict):
            return None
        _settings(settings, path)  # only to refuse what run refuses in [fleetcron]
        base_dir = Path(path).resolve().parent
        specs, refused, explained = [], 0, 0
        for name, options in table.items():

            def builder(given: dict[str, object], job: str = name) -> JobBuilder:
                checked = check_job_name(job, path)
                return JobBuilder(
                    checked, given, where=path, from_toml=True, base_dir=base_dir, now_us=None
                )

            whole = builder(options)
            relaxed = {key: value for key, value in options.items() if key not in _CROSS_CHECKED}
            spec = dataclasses.replace(
                builder(relaxed).build(),
                lock_at_least_us=whole.required_duration("lock_at_least"),
                jitter_us=whole.required_duration("jitter"),
                keepalive=whole.keepalive(),
            )
            try:
                whole.build()
            except ConfigurationError:
                refused += 1
                explained += bool(definition_failures(spec))
            specs.append(spec)
        backend, namespace = settings.get("backend"), settings.get("namespace")
        if not refused or explained < refused:
            return None  # run refuses the file for something the doctor does not check
        if not all(isinstance(value, str | None) for value in (backend, namespace)):
            return None
        return CheckedFile(
            specs=unique_jobs(specs, where=path),
            backend=backend,
            namespace=namespace,
            exact=False,
        )
    except (ConfigurationError, tomllib.TOMLDecodeError, UnicodeDecodeError, AttributeError):
        return None


def _namespace(args: argparse.Namespace, configured: str | None) -> str:
    """``--namespace`` > ``$FLEETCRON_NAMESPACE`` > the jobs file's > ``default``, as for
    ``fleetcron run``."""
    explicit: str | None = getattr(args, "namespace", None)
    if explicit is not None:
        return validate_namespace(explicit)
    return validate_namespace(os.environ.get(NAMESPACE_ENV) or configured or "default")


def render(findings: Sequence[Finding]) -> list[str]:
    """The text lines: one per finding, its advice indented below it, then a tally."""
    lines = []
    for finding in findings:
        lines.append(f"{finding.level:<4}  {finding.check}: {finding.message}")
        if finding.advice:
            lines.append(f"{_ADVICE_INDENT}{finding.advice}")
    counts = {level: sum(f.level == level for f in findings) for level in LEVELS}
    lines.append(f"{counts['fail']} failed, {counts['warn']} warning(s), {counts['ok']} ok")
    return lines


def _examine(
    url: StoreURL, namespace: str, checked: CheckedFile | None, jobs_file: str | None
) -> list[Finding]:
    """The findings of the store at ``url``, opened as it is: the doctor reports the
    schema's version and never changes it, and a store that is not there is a failed
    check, not a store made for the occasion."""
    try:
        store = open_store(url, create=False)
    except StoreMissing as missing:
        return missing_store(url.kind, url.redacted, missing, checked.specs if checked else ())
    try:
        facts = gather(
            store,
            kind=url.kind,
            namespace=namespace,
            specs=checked.specs if checked else None,
            jobs_file=jobs_file,
            compare_definitions=checked.exact if checked else False,
        )
    finally:
        store.close()
    return diagnose(facts)


def run(args: argparse.Namespace) -> int:
    """Gather, diagnose, print; exit 1 when a check failed."""
    checked = load_jobs(args.jobs_file) if args.jobs_file is not None else None
    namespace = _namespace(args, checked.namespace if checked else None)
    url = resolve_backend(getattr(args, "backend", None), checked.backend if checked else None)
    findings = _examine(url, namespace, checked, args.jobs_file)
    failed = any(finding.level == "fail" for finding in findings)
    if args.json:
        document = {
            "namespace": namespace,
            "backend": url.kind,
            "store": url.redacted,
            "healthy": not failed,
            "counts": {level: sum(f.level == level for f in findings) for level in LEVELS},
            "findings": [dataclasses.asdict(finding) for finding in findings],
        }
        print(json.dumps(document, indent=2, ensure_ascii=False))  # noqa: T201
    else:
        print("\n".join(render(findings)))  # noqa: T201
    return EXIT_UNHEALTHY if failed else 0
