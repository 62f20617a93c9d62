"""The options of ``fleetcron exec``, checked before any state is touched."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fleetcron.durations import to_micros
from fleetcron.errors import ConfigurationError
from fleetcron.job_options import argv_problem
from fleetcron.keepalive import effective_grace_us
from fleetcron.names import validate_job_name
from fleetcron.pings import check_ping_url

__all__ = ["ExecOptions", "exec_options", "option_micros"]


@dataclass(frozen=True, slots=True)
class ExecOptions:
    """Validated options of one ``exec`` invocation (durations in µs)."""

    name: str
    command: tuple[str, ...]
    lock_at_most: str
    lock_at_least: str
    keepalive: bool
    timeout_us: int | None
    wait: str | None
    skipped_exit_code: int
    kill_grace_us: int
    ping_url: str | None = None
    grace_us: int | None = None  # --grace (only with --schedule)
    stuck_after_us: int | None = None  # --stuck-after (only with --schedule)
    lock_mode: str = "lease"  # --lock-mode


def option_micros(value: str, option: str, *, positive: bool) -> int:
    """Parse the duration given to ``option``; refuse a negative (or, if ``positive``, zero)
    one with a message naming the option."""
    bound = "be positive" if positive else "not be negative"
    if value.strip().startswith("-"):
        raise ConfigurationError(f"{option} must {bound}, got {value!r}")
    micros = to_micros(value, what=option)
    if positive and micros <= 0:
        raise ConfigurationError(f"{option} must {bound}, got {value!r}")
    return micros


def exec_options(args: argparse.Namespace, command: list[str]) -> ExecOptions:
    """Check everything before any state is touched; raise ConfigurationError."""
    if not command:
        raise ConfigurationError("exec needs a command after '--', e.g. -- /opt/app/job.sh")
    # A shell cannot put a NUL in argv, but main() called from Python can.
    problem = argv_problem(command)
    if problem is not None:
        raise ConfigurationError(f"exec: {problem}")
    most = option_micros(args.lock_at_most, "--lock-at-most", positive=True)
    least = option_micros(args.lock_at_least, "--lock-at-least", positive=False)
    if least > most:
        raise ConfigurationError(
            f"--lock-at-least ({args.lock_at_least}) is longer than "
            f"--lock-at-most ({args.lock_at_most})"
        )
    timeout = (
        None if args.timeout is None else option_micros(args.timeout, "--timeout", positive=True)
    )
    if args.wait is not None:
        option_micros(args.wait, "--wait", positive=False)
    if not 0 <= args.skipped_exit_code <= 255:
        raise ConfigurationError(
            f"--skipped-exit-code must be between 0 and 255, got {args.skipped_exit_code}"
        )
    grace = (
        effective_grace_us(5_000_000, most)
        if args.kill_grace is None
        else option_micros(args.kill_grace, "--kill-grace", positive=False)
    )
    if grace >= most:
        # The grace is counted inside the lease: as long as the lease, the command would
        # be killed at once on every renewal hiccup.
        raise ConfigurationError(
            f"--kill-grace ({args.kill_grace}) must be shorter than "
            f"--lock-at-most ({args.lock_at_most})"
        )
    ping_url: str | None = getattr(args, "ping_url", None)
    if ping_url is not None:
        try:
            check_ping_url(ping_url)
        except ConfigurationError as exc:
            raise ConfigurationError(f"--ping-url: {exc.message}") from None
    if getattr(args, "schedule", None) is not None:
        # With --schedule the name is a job's too: its lease name must fit the store.
        validate_job_name(args.name)
    lock_mode: str = getattr(args, "lock_mode", "lease")
    if lock_mode == "advisory" and getattr(args, "schedule", None) is not None:
        # A slot is run again only once its holder's lease has expired (the run ledger
        # decides it, not the lock): an advisory lock would change nothing there.
        raise ConfigurationError(
            "--lock-mode advisory cannot be used with --schedule: a slot whose holder died "
            "is run again once its lease has expired, whatever the lock mode"
        )
    judged: dict[str, int | None] = {}
    for option in ("--grace", "--stuck-after"):
        value: str | None = getattr(args, option[2:].replace("-", "_"), None)
        if value is not None and getattr(args, "schedule", None) is None:
            # Without a schedule there is no slot to be late for and no ledger row to
            # judge: accepting the option would promise an alert that never comes.
            raise ConfigurationError(
                f"{option} needs --schedule (only a scheduled exec is in the run ledger)"
            )
        judged[option] = None if value is None else option_micros(value, option, positive=True)
    return ExecOptions(
        name=args.name,
        command=tuple(command),
        lock_at_most=args.lock_at_most,
        lock_at_least=args.lock_at_least,
        keepalive=not args.no_keepalive,
        timeout_us=timeout,
        wait=args.wait,
        skipped_exit_code=args.skipped_exit_code,
        kill_grace_us=grace,
        ping_url=ping_url,
        grace_us=judged["--grace"],
        stuck_after_us=judged["--stuck-after"],
        lock_mode=lock_mode,
    )
