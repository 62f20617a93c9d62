from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetcron import Fleet, jobsfile
from fleetcron.errors import ConfigurationError
from fleetcron.health import assess
from fleetcron.job_options import job_spec
from fleetcron.jobsfile import JobsFile, load_jobs_file
from fleetcron.jobspec import DEFAULTS, CallTarget, CommandTarget, unique_jobs
from fleetcron.models import JobRecord, RunRecord
from fleetcron.schedules import AtSchedule, CronSchedule, EverySchedule, from_datetime
from fleetcron.testing import MemoryStore

SECOND = 1_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
NOW = from_datetime(datetime(2025, 1, 1, tzinfo=UTC))
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path: Path, text: str, name: str = "jobs.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, "utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_jobs_file(path, now_us=NOW)
    message = caught.value.message
    assert "\n" not in message
    assert "Traceback" not in message
    return message


def module_named(tmp_path: Path, source: str) -> str:
    name = f"jobs_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(source, "utf-8")
    return name


# --- a good file ----------------------------------------------------------------------------


def test_a_full_jobs_file_loads_with_every_key(tmp_path: Path) -> None:
    module = module_named(tmp_path, "def sweep(ctx):\n    return ctx\n")
    path = write(
        tmp_path,
        f"""
[fleetcron]
backend = "sqlite:////tmp/x.db"
namespace = "prod"
mode = "leader"

[jobs.invoice-sweep]
schedule = "*/5 * * * *"
timezone = "Europe/Berlin"
command = ["/opt/app/bin/invoice-export", "--since", "yesterday"]
lock_at_most = "20m"
lock_at_least = "30s"
timeout = "15m"
overlap = "buffer_one"
catchup = "all"
catchup_window = "6h"
max_catchup = 12
retries = 2
retry_backoff = "1m"
jitter = "20s"
grace = "10m"
stuck_after = "45m"
ping_url = "https://hc-ping.example/abc"
keepalive = false

[jobs.py_job]
every = "30s"
call = "{module}:sweep"

[jobs."report.daily"]
at = "2030-01-01T09:00:00"
timezone = "Europe/Berlin"
command = ["report"]
""",
    )

    loaded = load_jobs_file(path, now_us=NOW)

    assert (loaded.backend, loaded.namespace, loaded.mode, loaded.path) == (
        "sqlite:////tmp/x.db",
        "prod",
        "leader",
        path,
    )
    assert [job.name for job in loaded.jobs] == ["invoice-sweep", "py_job", "report.daily"]
    sweep = loaded.job("invoice-sweep")
    assert sweep.schedule == CronSchedule("*/5 * * * *", "Europe/Berlin")
    assert sweep.timezone == "Europe/Berlin"
    assert sweep.target == CommandTarget(("/opt/app/bin/invoice-export", "--since", "yesterday"))
    assert sweep.lock_at_most_us == 20 * MINUTE
    assert sweep.lock_at_least_us == 30 * SECOND
    assert sweep.timeout_us == 15 * MINUTE
    assert (sweep.overlap, sweep.catchup) == ("buffer_one", "all")
    assert sweep.catchup_window_us == 6 * HOUR
    assert (sweep.max_catchup, sweep.retries) == (12, 2)
    assert sweep.retry_backoff_us == MINUTE
    assert sweep.jitter_us == 20 * SECOND
    assert sweep.grace_us == 10 * MINUTE
    assert sweep.stuck_after_us == 45 * MINUTE
    assert sweep.ping_url == "https://hc-ping.example/abc"
    assert sweep.keepalive is False

    py_job = loaded.job("py_job")
    assert py_job.schedule == EverySchedule(30 * SECOND)
    assert isinstance(py_job.target, CallTarget)
    assert py_job.target.reference == f"{module}:sweep"
    assert py_job.target.function("ctx") == "ctx"

    report = loaded.job("report.daily")
    assert report.schedule == AtSchedule(
        from_datetime(datetime(2030, 1, 1, 8, 0, tzinfo=UTC))  # 09:00 CET
    )


def test_defaults_are_applied_and_documented(tmp_path: Path) -> None:
    path = write(tmp_path, '[jobs.j]\nevery = "1m"\ncommand = ["true"]\n')

    job = load_jobs_file(path).jobs[0]

    assert job.timezone == "UTC"
    assert job.lock_at_most_us == 10 * MINUTE
    assert job.lock_at_least_us == 0
    assert job.timeout_us is None
    assert (job.overlap, job.catchup) == ("skip", "latest")
    assert job.catchup_window_us == HOUR
    assert (job.max_catchup, job.retries) == (100, 0)
    assert job.retry_backoff_us == 30 * SECOND
    assert job.jitter_us == 0
    assert job.grace_us is None
    assert job.stuck_after_us is None
    assert job.ping_url is None
    assert job.keepalive is True
    assert DEFAULTS["lock_at_most"] == "10m"


def test_call_modules_are_found_next_to_the_jobs_file_and_sys_path_is_restored(
    tmp_path: Path,
) -> None:
    module = module_named(tmp_path, "def run(ctx):\n    return 'ran'\n")
    path = write(tmp_path, f'[jobs.j]\nevery = "1m"\ncall = "{module}:run"\n')
    before = list(sys.path)

    job = load_jobs_file(path).jobs[0]

    assert sys.path == before
    assert isinstance(job.target, CallTarget)
    assert job.target.function(None) == "ran"


def test_the_example_jobs_file_loads() -> None:
    loaded = load_jobs_file(EXAMPLES / "jobs.toml")

    assert {job.name for job in loaded.jobs} >= {"heartbeat", "tick"}
    tick = loaded.job("tick")
    assert isinstance(tick.target, CallTarget)
    assert tick.target.reference == "jobs_demo:tick"
    assert loaded.backend is None  # the SQLite default


# --- fingerprints ------------------------------------------------------------------------------


def test_fingerprint_is_stable_and_follows_the_definition(tmp_path: Path) -> None:
    body = '[jobs.j]\nschedule = "*/5 * * * *"\ncommand = ["true"]\n'
    first = load_jobs_file(write(tmp_path, body, "a.toml")).jobs[0]
    second = load_jobs_file(write(tmp_path, body, "b.toml")).jobs[0]
    changed = load_jobs_file(write(tmp_path, body + "retries = 1\n", "c.toml")).jobs[0]

    assert first.fingerprint() == second.fingerprint()
    assert len(first.fingerprint()) == 32
    assert first.fingerprint() != changed.fingerprint()


def test_fingerprint_of_a_call_uses_the_reference_not_the_object() -> None:
    def run(ctx: object) -> None:
        return None

    def other(ctx: object) -> None:
        return None

    a = job_spec("j", where="test", every="1m", call=run)
    b = job_spec("j", where="test", every="1m", call=run)
    c = job_spec("j", where="test", every="1m", call=other)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert isinstance(a.target, CallTarget)
    assert a.target.reference.endswith(":" + run.__qualname__)


# --- bad input: every error names the file, the job and the key -------------------------------

BASE = 'every = "1m"\ncommand = ["true"]\n'


@pytest.mark.parametrize(
    ("body", "key", "fragment"),
    [
        ('schedule = "0 25 * * *"\ncommand = ["true"]', "schedule", "field 'hour' value 25"),
        ('schedule = "* * *"\ncommand = ["true"]', "schedule", "expected 5 fields"),
        ('schedule = 5\ncommand = ["true"]', "schedule", "must be a cron expression"),
        ('every = "0s"\ncommand = ["true"]', "every", "must be positive"),
        ('every = "-30s"\ncommand = ["true"]', "every", "negative duration '-30s'"),
        ('every = "soon"\ncommand = ["true"]', "every", "'soon' is not a duration"),
        ('every = 30\ncommand = ["true"]', "every", "write a string with a unit"),
        (BASE + 'lock_at_most = "-1m"', "lock_at_most", "negative duration"),
        (BASE + 'lock_at_most = "0s"', "lock_at_most", "must be positive"),
        (BASE + 'lock_at_least = "-1s"', "lock_at_least", "negative duration"),
        (BASE + 'timeout = "-5s"', "timeout", "negative duration"),
        (BASE + 'grace = "-1h"', "grace", "negative duration"),
        (BASE + 'stuck_after = "-1h"', "stuck_after", "negative duration '-1h'"),
        (BASE + 'stuck_after = "0s"', "stuck_after", "must be positive, got '0s'"),
        (BASE + "stuck_after = 3600", "stuck_after", "write a string with a unit"),
        (BASE + 'stuck_after = "a while"', "stuck_after", "'a while' is not a duration"),
        (BASE + 'retry_backoff = "-1s"', "retry_backoff", "negative duration"),
        (BASE + 'catchup_window = "-1s"', "catchup_window", "negative duration"),
        (BASE + 'jitter = "-1s"', "jitter", "negative duration"),
        (BASE + 'timezone = "Europe/Berln"', "timezone", "unknown time zone 'Europe/Berln'"),
        (BASE + 'overlap = "queue"', "overlap", "unknown value 'queue' (expected one of: skip,"),
        (BASE + 'catchup = "some"', "catchup", "unknown value 'some' (expected one of: skip,"),
        (BASE + "retries = -1", "retries", "must be at least 0"),
        (BASE + 'retries = "2"', "retries", "must be an integer"),
        (BASE + "retries = true", "retries", "must be an integer"),
        (BASE + "max_catchup = 0", "max_catchup", "must be at least 1"),
        (BASE + 'keepalive = "yes"', "keepalive", "must be true or false"),
        (BASE + 'ping_url = "ftp://x"', "ping_url", "is not an http(s) URL"),
        (BASE + 'scheduel = "* * * * *"', "scheduel", "unknown key"),
        (BASE + 'lock_at_least = "20m"', "lock_at_least", "is longer than lock_at_most 10m"),
        (BASE + 'lock_at_least = "1m"', "lock_at_least", "shortest interval 1m"),
        (BASE + 'jitter = "2m"', "jitter", "shortest interval 1m"),
        (
            'schedule = "30 2 * * *"\ntimezone = "Europe/Berlin"\ncommand = ["true"]\n'
            'lock_at_most = "2d"\nlock_at_least = "23h45m"',
            "lock_at_least",
            "shortest interval 23h30m",
        ),
        (
            BASE + 'timeout = "15m"\nlock_at_most = "10m"\nkeepalive = false',
            "lock_at_most",
            "10m is shorter than timeout 15m with keepalive = false",
        ),
        ('every = "1ms"\ncommand = ["true"]', "every", "shorter than the shortest interval"),
        (
            'every = "99ms"\ncommand = ["true"]',
            "every",
            "shorter than the shortest interval, 100ms",
        ),
        ('every = "1m"\ncommand = "echo hi"', "command", "must be a non-empty list of strings"),
        ('every = "1m"\ncommand = []', "command", "must be a non-empty list of strings"),
        ('every = "1m"\ncommand = ["echo", 1]', "command", "must be a non-empty list of strings"),
        ('every = "1m"\ncommand = [""]', "command", "the program (first element) is empty"),
        ('every = "1m"\ncall = "no_such_module_xq:run"', "call", "cannot import module"),
        ('every = "1m"\ncall = "nocolon"', "call", "is not a 'module:function' reference"),
        ('every = "1m"\ncall = ["a:b"]', "call", "must be a 'module:function' string"),
        (
            'at = "2025-03-30T02:30:00"\ntimezone = "Europe/Berlin"\ncommand = ["true"]',
            "at",
            "does not exist in Europe/Berlin (DST gap)",
        ),
        ('at = 2025-01-01\ncommand = ["true"]', "at", "a date without a time"),
        ('at = "tomorrow"\ncommand = ["true"]', "at", "is not an ISO 8601 date and time"),
    ],
)
def test_bad_job_keys_are_reported_with_file_job_and_key(
    tmp_path: Path, body: str, key: str, fragment: str
) -> None:
    path = write(tmp_path, f"[jobs.invoice-sweep]\n{body}\n")

    message = load_error(path)

    assert message.startswith(f"{path}: job 'invoice-sweep': key '{key}': "), message
    assert fragment in message


def test_unknown_time_zone_message_is_exactly_one_clear_line(tmp_path: Path) -> None:
    path = write(tmp_path, f'[jobs.invoice-sweep]\n{BASE}timezone = "Europe/Berln"\n')
    assert load_error(path) == (
        f"{path}: job 'invoice-sweep': key 'timezone': unknown time zone 'Europe/Berln'"
    )


def test_a_longer_lock_at_least_is_fine_when_the_cron_gaps_allow_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[jobs.j]\nschedule = "30 2 * * *"\ntimezone = "Europe/Berlin"\ncommand = ["true"]\n'
        'lock_at_most = "1d"\nlock_at_least = "23h"\n',
    )
    assert load_jobs_file(path, now_us=NOW).jobs[0].lock_at_least_us == 23 * HOUR


def test_lock_at_most_may_be_shorter_than_timeout_with_keepalive(tmp_path: Path) -> None:
    path = write(tmp_path, f'[jobs.j]\n{BASE}timeout = "15m"\nlock_at_most = "1m"\n')
    assert load_jobs_file(path).jobs[0].timeout_us == 15 * MINUTE


@pytest.mark.parametrize(
    ("body", "keys"),
    [
        ('command = ["true"]', "keys 'schedule', 'every', 'at': one is required"),
        ('schedule = "* * * * *"\nevery = "1m"\ncommand = ["true"]', "keys 'schedule' and 'every'"),
        ('every = "1m"', "keys 'command', 'call': one is required"),
        ('every = "1m"\ncommand = ["true"]\ncall = "m:f"', "keys 'command' and 'call'"),
    ],
)
def test_exclusive_keys_name_the_keys(tmp_path: Path, body: str, keys: str) -> None:
    path = write(tmp_path, f"[jobs.j]\n{body}\n")
    message = load_error(path)
    assert message.startswith(f"{path}: job 'j': {keys}"), message


def test_call_attribute_errors_name_module_and_attribute(tmp_path: Path) -> None:
    module = module_named(tmp_path, "VALUE = 3\n")
    for reference, fragment in (
        (f"{module}:nope", f"module '{module}' has no attribute 'nope'"),
        (f"{module}:VALUE", f"'{module}:VALUE' is not callable"),
    ):
        path = write(tmp_path, f'[jobs.j]\nevery = "1m"\ncall = "{reference}"\n')
        message = load_error(path)
        assert message.startswith(f"{path}: job 'j': key 'call': ")
        assert fragment in message


def test_a_call_module_that_fails_to_import_is_reported(tmp_path: Path) -> None:
    module = module_named(tmp_path, "raise RuntimeError('boom')\n")
    path = write(tmp_path, f'[jobs.j]\nevery = "1m"\ncall = "{module}:run"\n')
    message = load_error(path)
    assert f"key 'call': importing module '{module}' failed: RuntimeError: boom" in message


def test_a_dotted_job_name_gets_a_quoting_hint(tmp_path: Path) -> None:
    path = write(tmp_path, f"[jobs.report.daily]\n{BASE}")
    message = load_error(path)
    assert message.startswith(f"{path}: job 'report': key 'daily': unknown key")
    assert '[jobs."report.daily"]' in message


@pytest.mark.parametrize("name", ["-bad", "has space", "x" * 129, "ünï", "_private"])
def test_invalid_job_names_are_rejected(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, f'[jobs."{name}"]\n{BASE}')
    message = load_error(path)
    assert f"job {name!r}: invalid job name" in message


def test_longest_valid_job_name_is_accepted(tmp_path: Path) -> None:
    name = "a" + "b_.-9" * 25 + "zz"
    assert len(name) == 128
    path = write(tmp_path, f'[jobs."{name}"]\n{BASE}')
    assert load_jobs_file(path).jobs[0].name == name


# --- bad files ---------------------------------------------------------------------------------


def test_duplicate_job_tables_give_a_clean_message(tmp_path: Path) -> None:
    path = write(tmp_path, f"[jobs.a]\n{BASE}\n[jobs.a]\n{BASE}")
    message = load_error(path)
    assert message.startswith(f"{path}: job 'a' is defined twice (at line 5")


def test_a_missing_jobs_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert load_error(path) == f"{path}: jobs file not found"


def test_a_directory_is_not_a_jobs_file(tmp_path: Path) -> None:
    assert "is a directory" in load_error(tmp_path)


def test_a_device_behind_a_symlink_is_refused_not_read(tmp_path: Path) -> None:
    link = tmp_path / "jobs.toml"
    link.symlink_to("/dev/zero")  # would grow the process without end if read whole
    assert load_error(link) == (
        f"{link}: not a regular file (a pipe, socket or device); a jobs file must be a file"
    )


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "jobs.toml"
    os.mkfifo(fifo)
    assert "not a regular file" in load_error(fifo)


def test_a_jobs_file_larger_than_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobsfile, "MAX_JOBS_FILE_BYTES", 64)
    path = write(tmp_path, "# " + "x" * 100 + '\n[jobs.a]\nevery = "1m"\ncommand = ["true"]\n')
    assert "larger than" in load_error(path)


def test_invalid_toml_reports_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '[jobs.a]\nevery = "1m\ncommand = ["true"]\n')
    message = load_error(path)
    assert message.startswith(f"{path}: invalid TOML: ")
    assert "line 2, column" in message


def test_a_file_without_jobs_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, '[fleetcron]\nnamespace = "x"\n')
    assert "no jobs" in load_error(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            '[fleetcron]\nbackend = "x"\nnamespaces = "x"\n',
            "[fleetcron]: key 'namespaces': unknown",
        ),
        ('[fleetcron]\nmode = "solo"\n', "[fleetcron]: key 'mode': unknown value 'solo'"),
        ('[fleetcron]\nnamespace = ""\n', "[fleetcron]: key 'namespace': namespace is empty"),
        ("[fleetcron]\nbackend = 5\n", "[fleetcron]: key 'backend': must be a store URL"),
        ('schedule = "* * * * *"\n', "unknown top-level key 'schedule'"),
        ('jobs = ["a"]\n', "no jobs"),
        ("[jobs]\na = 5\n", "job 'a': must be a table"),
    ],
)
def test_bad_file_structure_is_reported(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text + f"\n[jobs.ok]\n{BASE}" if "jobs" not in text else text)
    message = load_error(path)
    assert message.startswith(f"{path}: ")
    assert fragment in message


# --- the Python API path ---------------------------------------------------------------------


def test_job_spec_accepts_python_values() -> None:
    def run(ctx: object) -> None:
        return None

    spec = job_spec(
        "py",
        where="Fleet.job",
        schedule="0 3 * * *",
        timezone="Europe/Berlin",
        call=run,
        lock_at_most=timedelta(minutes=5),
        lock_at_least=30,
        timeout=None,
    )

    assert spec.lock_at_most_us == 5 * MINUTE
    assert spec.lock_at_least_us == 30 * SECOND
    assert spec.timeout_us is None
    assert isinstance(spec.target, CallTarget)
    assert spec.target.function is run


def test_job_spec_errors_name_where_job_and_key() -> None:
    with pytest.raises(ConfigurationError) as caught:
        job_spec("py", where="Fleet.job", every="1m", command=["true"], overlap="never")
    assert caught.value.message.startswith("Fleet.job: job 'py': key 'overlap': unknown value")

    with pytest.raises(ConfigurationError, match=r"Fleet.job: job 'py': key 'every': "):
        job_spec("py", where="Fleet.job", every=-1, command=["true"])

    with pytest.raises(ConfigurationError, match=r"Fleet.job: job 'py': key 'colour'"):
        job_spec("py", where="Fleet.job", every="1m", command=["true"], colour="red")

    with pytest.raises(ConfigurationError, match=r"Fleet.job: job 'bad name': invalid job name"):
        job_spec("bad name", where="Fleet.job", every="1m", command=["true"])


def test_job_spec_imports_call_strings_relative_to_base_dir(tmp_path: Path) -> None:
    module = module_named(tmp_path, "def go(ctx):\n    return 1\n")
    spec = job_spec("j", where="api", base_dir=tmp_path, every="1m", call=f"{module}:go")
    assert isinstance(spec.target, CallTarget)
    assert spec.target.function(None) == 1


def test_job_spec_at_accepts_aware_and_naive_datetimes() -> None:
    aware = datetime(2030, 1, 1, 9, tzinfo=UTC)
    assert job_spec("a", where="api", at=aware, command=["x"]).schedule == AtSchedule(
        from_datetime(aware)
    )
    # 02:30 on 2025-10-26 occurs twice in Berlin: the first (CEST) is meant.
    repeated = job_spec(
        "b", where="api", at=datetime(2025, 10, 26, 2, 30), timezone="Europe/Berlin", command=["x"]
    )
    assert repeated.schedule == AtSchedule(from_datetime(datetime(2025, 10, 26, 0, 30, tzinfo=UTC)))


def test_duplicate_names_are_rejected_on_the_python_path() -> None:
    first = job_spec("same", where="api", every="1m", command=["a"])
    second = job_spec("same", where="api", every="2m", command=["b"])

    with pytest.raises(ConfigurationError, match="api: job 'same' is defined twice"):
        unique_jobs([first, second], where="api")
    with pytest.raises(ConfigurationError, match="job 'same' is defined twice"):
        JobsFile(jobs=(first, second))


def test_the_stored_definition_keeps_no_ping_url_in_clear() -> None:
    secret = "https://hc-ping.com/0b3c5e1e-2f7a-4c8e-9d1a-secret"
    one = job_spec("j", where="test", every="1m", command=["true"], ping_url=secret)
    other = job_spec("j", where="test", every="1m", command=["true"], ping_url=secret + "x")
    stored = json.dumps(one.definition())
    assert "secret" not in stored
    assert "hc-ping" not in stored
    assert one.fingerprint() != other.fingerprint()


def test_a_count_beyond_a_32_bit_column_is_refused_at_load(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[jobs.a]\nevery = "1m"\ncommand = ["true"]\nretention_keep = 99999999999999\n')
    with pytest.raises(ConfigurationError, match=r"retention_keep.*at most 2147483647"):
        load_jobs_file(str(jobs))


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            r'["/bin/echo", "--since", "a\u0000b"]',
            r"command[2] holds a NUL character at position 1",
        ),
        (r'["/bin/ec\u0000ho"]', r"command[0] holds a NUL character at position 7"),
    ],
    ids=["argument", "program"],
)
def test_a_nul_in_a_command_is_refused_at_load_not_at_every_run(
    tmp_path: Path, command: str, says: str
) -> None:
    path = write(tmp_path, f'[jobs.export]\nevery = "1m"\ncommand = {command}\n')

    message = load_error(path)

    assert message.startswith(f"{path}: job 'export': key 'command': {says}, "), message
    assert "which no program can be given" in message


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        ("a\x00b", r"command\[1\] holds a NUL character at position 1"),
        ("\ud800", r"command\[1\] is not text the file-system encoding can pass"),
    ],
    ids=["nul", "lone-surrogate"],
)
def test_a_command_no_program_can_be_given_is_refused_from_python(argument: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^Fleet.job: job 'j': key 'command': " + says):
        job_spec("j", where="Fleet.job", every="1m", command=["/bin/echo", argument])


def test_an_undecodable_byte_as_the_os_hands_it_over_is_a_fine_argument() -> None:
    # b"caf\xe9" (Latin-1) as sys.argv and os.listdir give it: passed back byte for byte.
    spec = job_spec("j", where="api", every="1m", command=["/bin/echo", "caf\udce9"])
    assert isinstance(spec.target, CommandTarget)
    assert spec.target.argv == ("/bin/echo", "caf\udce9")


# --- stuck_after ---------------------------------------------------------------------------


def test_stuck_after_is_in_the_definition_only_when_set(tmp_path: Path) -> None:
    plain = load_jobs_file(write(tmp_path, f"[jobs.j]\n{BASE}")).jobs[0]
    path = write(tmp_path, f'[jobs.j]\n{BASE}stuck_after = "2h"\n', "stuck.toml")
    stuck = load_jobs_file(path).jobs[0]

    # A job without the key keeps the fingerprint it had before the key existed.
    assert "stuck_after_us" not in plain.definition()
    assert stuck.definition()["stuck_after_us"] == 2 * HOUR
    assert {**stuck.definition(), "stuck_after_us": None} != plain.definition()
    assert stuck.fingerprint() != plain.fingerprint()


def test_stuck_after_from_python_and_what_status_makes_of_it() -> None:
    fleet = Fleet(MemoryStore(), namespace="ns")

    @fleet.job(every="1m", stuck_after=timedelta(minutes=5))
    def sweep() -> None: ...

    (spec,) = fleet.jobs
    assert spec.stuck_after_us == 5 * MINUTE
    assert job_spec("j", where="api", every="1m", command=["x"], stuck_after=90).stuck_after_us == (
        90 * SECOND
    )
    with pytest.raises(ConfigurationError, match=r"Fleet\.job: job 'late': key 'stuck_after'"):
        fleet.job("late", every="1m", stuck_after="-5m")(lambda: None)

    # The stored definition carries it to the health rules: a run holding its slot past
    # it is stuck, with no history of durations to go by.
    started = NOW - 6 * MINUTE
    row = JobRecord(
        namespace="ns",
        job=spec.name,
        paused=False,
        definition=json.dumps(spec.definition()),
        fingerprint=spec.fingerprint(),
        high_water_us=started,
        last_success_us=None,
        last_failure_us=None,
        updated_us=started,
        now_us=NOW,
    )
    running = RunRecord(
        namespace="ns",
        job=spec.name,
        slot_us=started,
        state="running",
        attempt=1,
        fence=1,
        holder="host:1",
        run_id="r",
        trigger="schedule",
        started_us=started,
        finished_us=None,
        expires_us=NOW + MINUTE,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error=None,
        output=None,
        now_us=NOW,
    )
    health = assess(row, [running])
    assert health.stuck_after_us == 5 * MINUTE
    assert health.stuck
    plain = json.loads(row.definition)
    del plain["stuck_after_us"]
    unset = assess(replace(row, definition=json.dumps(plain)), [running])
    assert not unset.stuck  # no durations known: no default threshold yet


def test_a_cron_expression_many_jobs_share_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cronsim import CronSim

    from fleetcron import schedules

    built: list[str] = []
    real = CronSim

    def counting(expression: str, *args: object, **kwargs: object) -> object:
        built.append(expression)
        return real(expression, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(schedules, "CronSim", counting)
    # Expressions no other test uses: what is kept from another test does not count.
    shared = ["13 3 * * 2", "47 21 * * 2"]
    body = "".join(
        f'[jobs.j{i}]\nschedule = "{shared[i % 2]}"\ncommand = ["true"]\n' for i in range(200)
    )
    loaded = load_jobs_file(write(tmp_path, body))
    assert len(loaded.jobs) == 200
    assert sorted(built) == sorted(shared), "one parse per expression, not six per job"
    built.clear()
    moment = from_datetime(datetime(2030, 1, 1, tzinfo=UTC))
    slots = {spec.schedule.next_after(moment) for spec in loaded.jobs}
    assert len(slots) == 2
    assert len(built) == 2, "the slot after a moment is worked out once per expression"
