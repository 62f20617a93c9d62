"""A job's definition: :class:`JobSpec`, its targets, and the validation of its options.

The options are the keys of a job in a jobs file (:mod:`fleetcron.jobsfile` lists them
with their defaults and meanings), given from TOML or from Python (``@fleet.job(...)``:
durations may then be seconds or a :class:`~datetime.timedelta`, ``call`` a callable and
``at`` a datetime). Every mistake is a one-line :class:`ConfigurationError` naming where
the job was defined, the job and the key.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Literal, NoReturn, TypeVar, get_args

from fleetcron.durations import format_duration, to_micros
from fleetcron.errors import ConfigurationError
from fleetcron.pings import check_ping_url
from fleetcron.schedules import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    from_datetime,
    parse_timezone,
)

__all__ = [
    "CATCHUP_POLICIES",
    "DEFAULTS",
    "DEFAULT_RETENTION",
    "ISOLATE_CHOICES",
    "JOB_KEYS",
    "MIN_EVERY_US",
    "OVERLAP_POLICIES",
    "CallTarget",
    "Catchup",
    "CommandTarget",
    "Isolate",
    "JobBuilder",
    "JobSpec",
    "Overlap",
    "Retention",
    "Target",
    "argv_problem",
    "check_job_name",
    "import_call",
    "job_spec",
    "one_line",
    "unique_jobs",
]

Overlap = Literal["skip", "buffer_one", "allow", "cancel_other"]
Isolate = Literal["none", "process"]
Catchup = Literal["skip", "latest", "all"]

OVERLAP_POLICIES: tuple[Overlap, ...] = get_args(Overlap)
ISOLATE_CHOICES: tuple[Isolate, ...] = get_args(Isolate)
CATCHUP_POLICIES: tuple[Catchup, ...] = get_args(Catchup)

DEFAULTS: Mapping[str, str | int | bool | None] = MappingProxyType(
    {
        "timezone": "UTC",
        "lock_at_most": "10m",
        "lock_at_least": "0s",
        "timeout": None,
        "overlap": "skip",
        "catchup": "latest",
        "catchup_window": "1h",
        "max_catchup": 100,
        "retries": 0,
        "retry_backoff": "30s",
        "jitter": "0s",
        "grace": None,
        "stuck_after": None,  # not set: from the job's recent durations (fleetcron.health)
        "ping_url": None,
        "keepalive": True,
        "isolate": "none",
        "retention": None,  # not set: the [fleetcron] table's, else DEFAULT_RETENTION's
        "retention_keep": None,
        "alert_webhook": None,
    }
)

MAX_COUNT = 2**31 - 1  # every count is stored in a 32-bit integer column or argument
MIN_EVERY_US = 100_000  # every slot is a ledger row and a claim: not a busy loop
JOB_KEYS: frozenset[str] = frozenset({"schedule", "every", "at", "command", "call", *DEFAULTS})
_SCHEDULE_KEYS = ("schedule", "every", "at")
_TARGET_KEYS = ("command", "call")
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_Choice = TypeVar("_Choice", bound=str)


@dataclass(frozen=True, slots=True)
class CommandTarget:
    """A command run as an argv list, never through a shell."""

    argv: tuple[str, ...]

    def definition(self) -> dict[str, object]:
        """``{"kind": "command", "argv": [...]}``."""
        return {"kind": "command", "argv": list(self.argv)}


@dataclass(frozen=True, slots=True)
class CallTarget:
    """A Python callable, known by its ``module:function`` reference."""

    reference: str
    function: Callable[..., object]

    def definition(self) -> dict[str, object]:
        """``{"kind": "call", "reference": "module:function"}``."""
        return {"kind": "call", "reference": self.reference}


Target = CommandTarget | CallTarget


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a job's finished runs stay in the run ledger.

    A row is deleted once it finished more than ``older_than_us`` ago *and* is not one of
    the job's newest ``keep`` finished rows: young rows stay whatever their number, and
    the newest ``keep`` stay whatever their age. A row still queued, running, or failed
    with a retry pending is never deleted, and does not count among the ``keep``.
    """

    older_than_us: int = 30 * 86_400_000_000
    keep: int = 100


DEFAULT_RETENTION = Retention()
"""30 days, and at least the newest 100 runs of each job."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """One validated job definition. Durations are integer microseconds."""

    name: str
    schedule: Schedule
    timezone: str
    target: Target
    lock_at_most_us: int
    lock_at_least_us: int
    timeout_us: int | None
    overlap: Overlap
    catchup: Catchup
    catchup_window_us: int
    max_catchup: int
    retries: int
    retry_backoff_us: int
    jitter_us: int
    grace_us: int | None
    ping_url: str | None
    keepalive: bool
    isolate: Isolate = "none"
    retention_us: int | None = None
    retention_keep: int | None = None
    alert_webhook: str | None = None
    stuck_after_us: int | None = None
    """A run holding its slot longer than this is *stuck* (``None``: judged from the job's
    recent durations, :mod:`fleetcron.health`)."""

    @property
    def retention(self) -> Retention:
        """The job's retention rule: its ``retention`` and ``retention_keep`` (given for
        the job, or for every job of its file), each else :data:`DEFAULT_RETENTION`'s."""
        return Retention(
            older_than_us=(
                DEFAULT_RETENTION.older_than_us if self.retention_us is None else self.retention_us
            ),
            keep=DEFAULT_RETENTION.keep if self.retention_keep is None else self.retention_keep,
        )

    def definition(self) -> dict[str, object]:
        """The definition as plain JSON-able data (the name excluded): what replicas compare."""
        return {
            "schedule": dict(self.schedule.definition()),
            "timezone": self.timezone,
            "target": self.target.definition(),
            "lock_at_most_us": self.lock_at_most_us,
            "lock_at_least_us": self.lock_at_least_us,
            "timeout_us": self.timeout_us,
            "overlap": self.overlap,
            "catchup": self.catchup,
            "catchup_window_us": self.catchup_window_us,
            "max_catchup": self.max_catchup,
            "retries": self.retries,
            "retry_backoff_us": self.retry_backoff_us,
            "jitter_us": self.jitter_us,
            "grace_us": self.grace_us,
            # The URL holds the check's secret: the store keeps only a digest of it, enough
            # for replicas to tell two definitions apart.
            "ping_url": _digest(self.ping_url) if self.ping_url is not None else None,
            "keepalive": self.keepalive,
            # Only when set: a job defined before the key existed keeps its fingerprint.
            **({"isolate": self.isolate} if self.isolate != "none" else {}),
            **({"retention_us": self.retention_us} if self.retention_us is not None else {}),
            **({"retention_keep": self.retention_keep} if self.retention_keep is not None else {}),
            **({"stuck_after_us": self.stuck_after_us} if self.stuck_after_us is not None else {}),
            **(
                {"alert_webhook": _digest(self.alert_webhook)}
                if self.alert_webhook is not None
                else {}
            ),
        }

    def fingerprint(self) -> str:
        """A stable hash of :meth:`definition` (32 hex digits), equal across processes.

        A ``call`` target contributes its ``module:function`` reference, not the object.
        """
        canonical = json.dumps({"v": 1, **self.definition()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _digest(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:32]


def unique_jobs(specs: Iterable[JobSpec], *, where: str) -> tuple[JobSpec, ...]:
    """``specs`` as a tuple, or a :class:`ConfigurationError` if a name occurs twice."""
    seen: set[str] = set()
    result: list[JobSpec] = []
    for spec in specs:
        if spec.name in seen:
            raise ConfigurationError(f"{where}: job {spec.name!r} is defined twice")
        seen.add(spec.name)
        result.append(spec)
    return tuple(result)


def one_line(message: str) -> str:
    return " ".join(message.split())


def import_call(reference: str, base_dir: Path | None) -> Callable[..., object]:
    """The callable a ``module:function`` reference names, imported with ``base_dir`` first
    on ``sys.path``; :class:`ConfigurationError` saying what failed."""
    if not _REFERENCE.fullmatch(reference):
        raise ConfigurationError(f"{reference!r} is not a 'module:function' reference")
    module_name, _, attribute = reference.partition(":")
    entry = str(base_dir) if base_dir is not None else None
    added = entry is not None and entry not in sys.path
    if added:
        sys.path.insert(0, str(entry))
    try:
        importlib.invalidate_caches()
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            where = "the jobs file's directory and sys.path" if base_dir else "sys.path"
            raise ConfigurationError(
                f"cannot import module {module_name!r}: not found on {where}"
            ) from None
        raise ConfigurationError(f"importing module {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigurationError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if added:
            sys.path.remove(str(entry))
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(
                f"module {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(target):
        raise ConfigurationError(f"{reference!r} is not callable")
    return target


def argv_problem(argv: Sequence[str]) -> str | None:
    """What keeps ``argv`` from being started, or ``None``: an element holding a NUL
    character, or one the file-system encoding cannot encode (a lone surrogate that is not
    one of an undecodable byte as the OS hands argv over). Either would fail every run of
    the job as it starts ("embedded null byte"), so it is refused where the command is
    given."""
    for index, arg in enumerate(argv):
        # The OS passes each argument as a NUL-terminated C string.
        nul = arg.find("\x00")
        if nul >= 0:
            return (
                f"command[{index}] holds a NUL character at position {nul}, which no "
                f"program can be given: {arg[:40]!r}"
            )
        try:
            os.fsencode(arg)
        except UnicodeEncodeError as exc:
            return (
                f"command[{index}] is not text the file-system encoding can pass to a "
                f"program ({exc.reason} at position {exc.start}): {arg[:40]!r}"
            )
    return None


def _reference_of(function: Callable[..., object]) -> str:
    module = getattr(function, "__module__", None) or "?"
    qualname = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}:{qualname}"


class JobBuilder:
    """Validates one job's options; every failure names ``where``, the job and the key."""

    def __init__(
        self,
        name: str,
        options: Mapping[str, object],
        *,
        where: str,
        from_toml: bool,
        base_dir: Path | None,
        now_us: int | None,
    ) -> None:
        self.name = name
        self.options = options
        self.where = where
        self.from_toml = from_toml
        self.base_dir = base_dir
        self.now_us = now_us

    def fail(self, key: str, problem: str) -> NoReturn:
        raise ConfigurationError(
            one_line(f"{self.where}: job {self.name!r}: key {key!r}: {problem}")
        )

    def value(self, key: str) -> object:
        value = self.options.get(key)
        return DEFAULTS.get(key) if value is None else value

    def duration(self, key: str, *, positive: bool = False) -> int | None:
        value = self.value(key)
        if value is None:
            return None
        if self.from_toml and not isinstance(value, str):
            self.fail(key, f'{value!r} is not a duration: write a string with a unit, e.g. "30s"')
        if isinstance(value, str) and value.strip().startswith("-"):
            self.fail(key, f"negative duration {value!r} is not allowed")
        if not isinstance(value, str | int | float | timedelta):
            self.fail(key, f"{value!r} is not a duration")
        try:
            micros = to_micros(value, what=key)
        except ConfigurationError as exc:
            self.fail(key, exc.message.removeprefix(f"{key}: "))
        if micros < 0:
            self.fail(key, f"negative duration {value!r} is not allowed")
        if positive and micros == 0:
            self.fail(key, f"must be positive, got {value!r}")
        return micros

    def required_duration(self, key: str, *, positive: bool = False) -> int:
        micros = self.duration(key, positive=positive)
        assert micros is not None  # every such key has a default
        return micros

    def integer(self, key: str, *, minimum: int) -> int:
        value = self.value(key)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, not {value!r}")
        if value < minimum:
            self.fail(key, f"must be at least {minimum}, got {value}")
        if value > MAX_COUNT:
            self.fail(key, f"must be at most {MAX_COUNT}, got {value}")
        return value

    def choice(self, key: str, allowed: tuple[_Choice, ...]) -> _Choice:
        value = self.value(key)
        for option in allowed:
            if value == option:
                return option
        self.fail(key, f"unknown value {value!r} (expected one of: {', '.join(allowed)})")

    def exactly_one(self, keys: tuple[str, ...], what: str) -> str:
        present = [key for key in keys if self.options.get(key) is not None]
        listed = ", ".join(repr(key) for key in keys)
        if not present:
            raise ConfigurationError(
                f"{self.where}: job {self.name!r}: keys {listed}: one is required ({what})"
            )
        if len(present) > 1:
            both = " and ".join(repr(key) for key in present)
            raise ConfigurationError(
                f"{self.where}: job {self.name!r}: keys {both}: give only one ({what})"
            )
        return present[0]

    def timezone(self) -> str:
        value = self.value("timezone")
        try:
            parse_timezone(value)
        except ConfigurationError as exc:
            self.fail("timezone", exc.message)
        assert isinstance(value, str)
        return value

    def schedule(self, timezone: str) -> Schedule:
        kind = self.exactly_one(_SCHEDULE_KEYS, "a cron schedule, an interval or a moment")
        if kind == "every":
            every = self.required_duration("every", positive=True)
            if every < MIN_EVERY_US:
                self.fail(
                    "every",
                    f"{format_duration(every)} is shorter than the shortest interval, "
                    f"{format_duration(MIN_EVERY_US)}: each slot is a ledger row claimed "
                    "through the store",
                )
            return EverySchedule(every)
        if kind == "at":
            return AtSchedule(self.moment(timezone))
        expression = self.options["schedule"]
        if not isinstance(expression, str):
            self.fail("schedule", f"must be a cron expression string, not {expression!r}")
        try:
            return CronSchedule(expression, timezone)
        except ConfigurationError as exc:
            self.fail("schedule", exc.message)

    def moment(self, timezone: str) -> int:
        value = self.options["at"]
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value.strip())
            except ValueError:
                self.fail("at", f"{value!r} is not an ISO 8601 date and time")
        if not isinstance(value, datetime):
            kind = "a date without a time" if isinstance(value, date) else repr(value)
            self.fail("at", f"{kind} is not a date and time (e.g. 2025-01-01T09:00:00+01:00)")
        if value.tzinfo is None:
            zone = parse_timezone(timezone)
            aware = value.replace(tzinfo=zone, fold=0)
            # A wall time that does not exist in the zone does not survive a round trip.
            if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != value.replace(fold=0):
                self.fail("at", f"{value.isoformat()} does not exist in {timezone} (DST gap)")
            value = aware
        return from_datetime(value)

    def target(self) -> Target:
        kind = self.exactly_one(_TARGET_KEYS, "a command argv list or a 'module:function'")
        value = self.options[kind]
        if kind == "command":
            if (
                not isinstance(value, list | tuple)
                or not value
                or not all(isinstance(arg, str) for arg in value)
            ):
                self.fail("command", f"must be a non-empty list of strings, not {value!r}")
            if not value[0]:
                self.fail("command", "the program (first element) is empty")
            problem = argv_problem(value)
            if problem is not None:
                self.fail("command", problem)
            return CommandTarget(tuple(value))
        if callable(value) and not isinstance(value, str):
            if self.from_toml:
                self.fail("call", "must be a 'module:function' string")
            return CallTarget(_reference_of(value), value)
        if not isinstance(value, str):
            self.fail("call", f"must be a 'module:function' string, not {value!r}")
        try:
            function = import_call(value.strip(), self.base_dir)
        except ConfigurationError as exc:
            self.fail("call", exc.message)
        return CallTarget(value.strip(), function)

    def ping_url(self, key: str = "ping_url") -> str | None:
        value = self.value(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(key, f"must be a string, not {type(value).__name__}")
        try:
            return check_ping_url(value)  # the message shows the URL without its secret
        except ConfigurationError as exc:
            self.fail(key, exc.message)

    def keepalive(self) -> bool:
        value = self.value("keepalive")
        if not isinstance(value, bool):
            self.fail("keepalive", f"must be true or false, not {value!r}")
        return value

    def retention(self) -> tuple[int | None, int | None]:
        """``retention`` (an age, µs) and ``retention_keep`` (a count), each ``None`` when
        not given."""
        older = self.duration("retention")
        if self.value("retention_keep") is None:
            return older, None
        return older, self.integer("retention_keep", minimum=0)

    def build(self) -> JobSpec:
        unknown = sorted(set(self.options) - JOB_KEYS)
        if unknown:
            key = unknown[0]
            hint = ""
            if isinstance(self.options[key], Mapping):
                hint = f' (a job name containing "." must be quoted: [jobs."{self.name}.{key}"])'
            self.fail(key, f"unknown key{hint}; known keys: {', '.join(sorted(JOB_KEYS))}")
        timezone = self.timezone()
        schedule = self.schedule(timezone)
        target = self.target()
        lock_at_most = self.required_duration("lock_at_most", positive=True)
        lock_at_least = self.required_duration("lock_at_least")
        timeout = self.duration("timeout", positive=True)
        catchup_window = self.required_duration("catchup_window")
        retry_backoff = self.required_duration("retry_backoff")
        jitter = self.required_duration("jitter")
        grace = self.duration("grace", positive=True)
        stuck_after = self.duration("stuck_after", positive=True)
        overlap = self.choice("overlap", OVERLAP_POLICIES)
        catchup = self.choice("catchup", CATCHUP_POLICIES)
        max_catchup = self.integer("max_catchup", minimum=1)
        retries = self.integer("retries", minimum=0)
        keepalive = self.keepalive()
        ping_url = self.ping_url()
        alert_webhook = self.ping_url("alert_webhook")
        isolate = self.choice("isolate", ISOLATE_CHOICES)
        retention, retention_keep = self.retention()
        if isolate == "process" and not isinstance(target, CallTarget):
            self.fail(
                "isolate",
                '"process" applies to call jobs; a command already runs in a process '
                "group of its own",
            )
        if isolate == "process" and isinstance(target, CallTarget) and "<" in target.reference:
            self.fail(
                "isolate",
                f'"process" needs a function a child process can import by name; '
                f"{target.reference} is not one (define it at module level)",
            )

        if lock_at_least > lock_at_most:
            self.fail(
                "lock_at_least",
                f"{format_duration(lock_at_least)} is longer than lock_at_most "
                f"{format_duration(lock_at_most)}",
            )
        if not keepalive and timeout is not None and lock_at_most < timeout:
            self.fail(
                "lock_at_most",
                f"{format_duration(lock_at_most)} is shorter than timeout "
                f"{format_duration(timeout)} with keepalive = false: the job would be "
                "killed when the lease ends, before its timeout",
            )
        if lock_at_least > 0 or jitter > 0:
            interval = schedule.min_interval_us(from_us=self.now_us)
            if interval is not None and lock_at_least >= interval:
                self.fail(
                    "lock_at_least",
                    f"{format_duration(lock_at_least)} is not shorter than the schedule's "
                    f"shortest interval {format_duration(interval)}: it would block the next slot",
                )
            if interval is not None and jitter >= interval:
                self.fail(
                    "jitter",
                    f"{format_duration(jitter)} is not shorter than the schedule's "
                    f"shortest interval {format_duration(interval)}",
                )
        return JobSpec(
            name=self.name,
            schedule=schedule,
            timezone=timezone,
            target=target,
            lock_at_most_us=lock_at_most,
            lock_at_least_us=lock_at_least,
            timeout_us=timeout,
            overlap=overlap,
            catchup=catchup,
            catchup_window_us=catchup_window,
            max_catchup=max_catchup,
            retries=retries,
            retry_backoff_us=retry_backoff,
            jitter_us=jitter,
            grace_us=grace,
            ping_url=ping_url,
            keepalive=keepalive,
            isolate=isolate,
            retention_us=retention,
            retention_keep=retention_keep,
            alert_webhook=alert_webhook,
            stuck_after_us=stuck_after,
        )


def check_job_name(name: object, where: str) -> str:
    if not isinstance(name, str):
        raise ConfigurationError(f"{where}: job name must be a string, not {name!r}")
    if not _JOB_NAME.fullmatch(name):
        raise ConfigurationError(
            one_line(
                f"{where}: job {name!r}: invalid job name: use 1-128 characters from "
                "A-Z a-z 0-9 _ . - starting with a letter or digit"
            )
        )
    return name


def job_spec(
    name: str,
    *,
    where: str,
    base_dir: str | Path | None = None,
    now_us: int | None = None,
    **options: object,
) -> JobSpec:
    """Validate one job given as keyword options named like the jobs-file keys.

    ``where`` prefixes every error message (a file name, or e.g. ``"Fleet.job"``).
    From Python, ``call`` may be a callable, durations may be seconds or timedeltas, and
    ``at`` a datetime. A ``call`` string is imported now, with ``base_dir`` (if given)
    first on ``sys.path``. ``now_us`` anchors the year over which the shortest cron
    interval is measured (default: now). Options set to ``None`` take their default.
    """
    checked = check_job_name(name, where)
    return JobBuilder(
        checked,
        options,
        where=where,
        from_toml=False,
        base_dir=Path(base_dir) if base_dir is not None else None,
        now_us=now_us,
    ).build()
