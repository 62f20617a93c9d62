"""The validation of a job's options: from a jobs file's keys or ``@fleet.job(...)`` to a
:class:`~fleetcron.jobspec.JobSpec`.

The options are the keys of a job in a jobs file (:mod:`fleetcron.jobsfile` lists them
with their defaults and meanings), given from TOML or from Python (``@fleet.job(...)``:
durations may then be seconds or a :class:`~datetime.timedelta`, ``call`` a callable and
``at`` a datetime). Every mistake is a one-line :class:`ConfigurationError` naming where
the job was defined, the job and the key.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

from fleetcron.durations import format_duration, to_micros
from fleetcron.errors import ConfigurationError
from fleetcron.jobspec import (
    CATCHUP_POLICIES,
    DEFAULTS,
    ISOLATE_CHOICES,
    JOB_KEYS,
    MAX_COUNT,
    MIN_EVERY_US,
    OVERLAP_POLICIES,
    CallTarget,
    CommandTarget,
    JobSpec,
    Target,
    one_line,
)
from fleetcron.pings import check_ping_url
from fleetcron.schedules import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    from_datetime,
    parse_timezone,
)

__all__ = ["JobBuilder", "argv_problem", "check_job_name", "import_call", "job_spec"]

_SCHEDULE_KEYS = ("schedule", "every", "at")
_TARGET_KEYS = ("command", "call")
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_Choice = TypeVar("_Choice", bound=str)
_T = TypeVar("_T")


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
    """Validates one job's options; every failure names ``where``, the job and the key.

    ``shared``, given by a loader of many jobs, maps each value already used by one of
    them to its object: a value equal to one of those (a duration, a time zone, a
    schedule, a command or one of its arguments) is given that object, so 100,000 jobs
    hold one ``every = "5m"`` schedule and one ``"/bin/echo"``, not 100,000 of each."""

    def __init__(
        self,
        name: str,
        options: Mapping[str, object],
        *,
        where: str,
        from_toml: bool,
        base_dir: Path | None,
        now_us: int | None,
        shared: dict[type, dict[Any, Any]] | None = None,
    ) -> None:
        self.options = options
        self.where = where
        self.from_toml = from_toml
        self.base_dir = base_dir
        self.now_us = now_us
        self.shared = shared
        self.name = self.share(name)

    def share(self, value: _T) -> _T:
        """The object of a value equal to ``value`` (of the same type) already used, else
        ``value``, now used."""
        if self.shared is None:
            return value
        # By type first: True, 1 and 1.0 are equal, and not interchangeable.
        return cast(_T, self.shared.setdefault(type(value), {}).setdefault(value, value))

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
        return self.share(micros)

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
        return self.share(value)

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
            return self.share(EverySchedule(every))
        if kind == "at":
            return AtSchedule(self.moment(timezone))
        expression = self.options["schedule"]
        if not isinstance(expression, str):
            self.fail("schedule", f"must be a cron expression string, not {expression!r}")
        # Keyed by the expression as written: a known one is not parsed again.
        known = self.shared.setdefault(CronSchedule, {}) if self.shared is not None else {}
        schedule = known.get((expression, timezone))
        if schedule is None:
            try:
                schedule = known[expression, timezone] = CronSchedule(expression, timezone)
            except ConfigurationError as exc:
                self.fail("schedule", exc.message)
        return cast(CronSchedule, schedule)

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
            return self.share(CommandTarget(tuple(self.share(arg) for arg in value)))
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
