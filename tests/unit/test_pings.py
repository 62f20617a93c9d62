"""Pings: healthchecks.io-style URLs per outcome, in order per run, retried, redacted, and
never in the way of a run. Endpoints are local servers (tests/unit/ping_server.py); tests
wait on what the server received, never for a fixed time."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fleetcron.context import RunContext
from fleetcron.errors import ConfigurationError
from fleetcron.job_options import job_spec
from fleetcron.models import RunOutcome
from fleetcron.pings import (
    BODY_LIMIT,
    AsyncPinger,
    Ping,
    Pinger,
    PingPolicy,
    check_ping_url,
    finish_ping,
    redact,
    start_ping,
)
from fleetcron.stores.memory import MemoryStore
from unit.ping_server import PingServer, Received, SilentServer
from unit.test_scheduler import ledger, run_replicas

SECRET = "5f1e9c1a-7d2b-4c55-9a1e-0b5ec4e7c0de"
HC = f"https://hc-ping.com/{SECRET}"
FAST = PingPolicy(timeout_s=5.0, tries=3, backoff_s=0.01)


class Records(logging.Handler):
    """Every record of the ``fleetcron`` logger during a test."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def action(self, action: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "action", None) == action]

    def text(self) -> str:
        return "\n".join(r.getMessage() for r in self.records)


@pytest.fixture
def records() -> Iterator[Records]:
    logger = logging.getLogger("fleetcron")
    handler = Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def server() -> Iterator[PingServer]:
    running = PingServer()
    yield running
    running.close()


def failed(exit_code: int | None = None, error: str = "boom", output: str | None = None) -> Any:
    return RunOutcome(state="failed", exit_code=exit_code, error=error, output=output)


SUCCEEDED = RunOutcome(state="succeeded", exit_code=0)


# -- the URL of each outcome ------------------------------------------------------------
def test_each_outcome_is_pinged_to_its_healthchecks_url() -> None:
    def finish(outcome: RunOutcome, exit_status: int | None, retrying: bool = False) -> Ping:
        return finish_ping("job", HC, "R", outcome, exit_status=exit_status, retrying=retrying)

    start = start_ping("job", HC, "R")
    assert (start.method, start.url, start.body) == ("GET", f"{HC}/start?rid=R", None)
    success = finish(SUCCEEDED, 0)
    assert (success.method, success.url, success.body) == ("GET", f"{HC}?rid=R", None)
    # A command that exited by itself: its status; any other failure: /fail.
    assert finish(failed(3, "exit status 3"), 3).url == f"{HC}/3?rid=R"
    assert finish(failed(None, "RuntimeError: boom"), None).url == f"{HC}/fail?rid=R"
    assert finish(failed(143, "timed out"), None).url == f"{HC}/fail?rid=R"
    cancelled = RunOutcome(state="cancelled", exit_code=143, error="cancel requested")
    assert finish(cancelled, None).url == f"{HC}/fail?rid=R"
    lost = RunOutcome(state="lost", error="outcome refused: fence 7 is no longer current")
    assert finish(lost, None).url == f"{HC}/fail?rid=R"
    # A failed attempt that will be retried is only logged: the last attempt decides.
    assert finish(failed(3, "exit status 3"), 3, retrying=True).url == f"{HC}/log?rid=R"
    assert {finish(o, None).method for o in (failed(), cancelled, lost)} == {"POST"}


def test_the_slug_form_keeps_its_query_and_a_trailing_slash_is_not_doubled() -> None:
    slug = f"https://hc-ping.com/{SECRET}/db-backup?create=1"
    assert (
        start_ping("j", slug, "R").url
        == f"https://hc-ping.com/{SECRET}/db-backup/start?create=1&rid=R"
    )
    assert start_ping("j", f"{HC}/", "R").url == f"{HC}/start?rid=R"
    assert finish_ping("j", f"{HC}/", "R", SUCCEEDED, exit_status=0).url == f"{HC}?rid=R"
    assert start_ping("j", HC, "a b&c").url == f"{HC}/start?rid=a+b%26c"


def test_a_failure_carries_the_end_of_its_output_then_its_error_bounded() -> None:
    output = "first line\n" + "x" * 20_000 + "\nthe last line of output\n"
    ping = finish_ping("j", HC, "R", failed(3, "exit status 3", output), exit_status=3)
    assert ping.body is not None
    assert len(ping.body) <= BODY_LIMIT
    assert ping.body.endswith(b"the last line of output\nexit status 3\n")
    assert b"first line" not in ping.body
    # A multi-byte character cut in two at the start is dropped, not sent broken.
    wide = finish_ping("j", HC, "R", failed(1, "é" * 4096, "€" * 4096), exit_status=1)
    assert wide.body is not None
    assert len(wide.body) <= BODY_LIMIT
    assert wide.body.decode("utf-8").endswith("é" * 4096 + "\n")
    plain = finish_ping("j", HC, "R", RunOutcome(state="lost"), exit_status=None)
    assert plain.body == b"lost\n"


# -- secrecy ------------------------------------------------------------------------------
def test_a_redacted_ping_url_shows_its_scheme_and_host_only() -> None:
    assert redact(HC) == "https://hc-ping.com/***"
    assert redact(f"https://hc-ping.com/ping/{SECRET}/backup?create=1") == "https://hc-ping.com/***"
    assert redact(f"http://user:{SECRET}@[::1]:8000/p/{SECRET}") == "http://[::1]:8000/***"
    assert redact(f"https://cronitor.link/p/{SECRET}/job") == "https://cronitor.link/***"
    assert redact("not a url") == "***"
    assert repr(start_ping("j", HC, "R")).count(SECRET) == 0


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (f"ftp://hc-ping.com/{SECRET}", "is not an http(s) URL"),
        (f"hc-ping.com/{SECRET}", "is not an http(s) URL"),
        (f"https:///{SECRET}", "has no host"),
        (f"https://hc-ping.com/{SECRET} ", "whitespace"),
        (f"https://hc-ping.com/{SECRET}\n", "whitespace"),
        (f"https://hc-ping.com/ {SECRET}", "whitespace"),
        (f"https://hc-ping.com/{SECRET}/é", "non-ASCII"),
        (f"https://hc-ping.com:99999/{SECRET}", "not a valid URL"),
        (f"https://me:{SECRET}@hc-ping.com/x", "user name or password"),
    ],
)
def test_a_bad_ping_url_is_refused_without_showing_its_secret(url: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as checked:
        check_ping_url(url)
    assert problem in checked.value.message
    with pytest.raises(ConfigurationError) as loaded:
        job_spec("backup", where="jobs.toml", every="1m", command=["true"], ping_url=url)
    message = loaded.value.message
    assert message.startswith("jobs.toml: job 'backup': key 'ping_url': ")
    assert problem in message
    assert SECRET not in message


def test_good_ping_urls_are_accepted_as_given() -> None:
    for url in (HC, f"http://127.0.0.1:8000/ping/{SECRET}/slug?create=1", "https://[::1]/x"):
        assert check_ping_url(url) == url
        spec = job_spec("backup", where="t", every="1m", command=["true"], ping_url=url)
        assert spec.ping_url == url
    with pytest.raises(ConfigurationError, match="must be a string, not list"):
        job_spec("backup", where="t", every="1m", command=["true"], ping_url=[HC])


# -- sending: order, retries, the one warning ---------------------------------------------
def check_url(server: PingServer) -> str:
    return f"{server.base}/ping/{SECRET}"


async def wait_received(server: PingServer, condition: Any, what: str) -> Any:
    return await asyncio.to_thread(server.wait_for, condition, what=what)


async def test_start_and_finish_pair_up_by_run_id_in_order_even_when_the_start_is_slow(
    records: Records,
) -> None:
    release = threading.Event()

    def answer(received: Received) -> int:
        if received.rid == "A" and received.path.endswith("/start"):
            release.wait(10)  # run A's start is slow to answer
        return 200

    server = PingServer(answer)
    url = check_url(server)
    pinger = AsyncPinger(FAST)
    try:
        pinger.send(start_ping("job", url, "A"))
        pinger.send(finish_ping("job", url, "A", SUCCEEDED, exit_status=0))
        pinger.send(start_ping("job", url, "B"))
        # Run B's start goes out while A's start still waits: runs do not wait on each other.
        # (Either may reach the server first: they are sent side by side.)
        seen = await wait_received(
            server, lambda got: [r for r in got if r.rid == "B"], "run B's start"
        )
        await wait_received(server, lambda got: [r for r in got if r.rid == "A"], "A's start")
        assert [(r.rid, r.path) for r in server.received if r.rid == "A"] == [
            ("A", f"/ping/{SECRET}/start")
        ], "run A's finish went out before its start was answered"
        release.set()
        await pinger.close(10)
    finally:
        release.set()
        server.close()
    got = server.received
    assert [(r.method, r.path) for r in got if r.rid == "A"] == [
        ("GET", f"/ping/{SECRET}/start"),
        ("GET", f"/ping/{SECRET}"),
    ]
    order = [(r.rid, r.path) for r in got]
    assert order.index(("B", seen[0].path)) < order.index(("A", f"/ping/{SECRET}"))
    assert all(r.user_agent.startswith("fleetcron/") for r in got)
    assert len(records.action("ping_sent")) == 3
    assert not records.action("ping_failed")
    assert SECRET not in records.text()


async def test_a_failing_endpoint_is_tried_again_then_reported_once_redacted(
    records: Records,
) -> None:
    server = PingServer(lambda _: 503)
    pinger = AsyncPinger(FAST)
    try:
        pinger.send(finish_ping("nightly", check_url(server), "R", failed(3), exit_status=3))
        await pinger.close(10)
    finally:
        server.close()
    assert [(r.method, r.path) for r in server.received] == [("POST", f"/ping/{SECRET}/3")] * 3
    (warning,) = records.action("ping_failed")
    assert warning.levelno == logging.WARNING
    assert getattr(warning, "job", None) == "nightly"
    message = warning.getMessage()
    assert f"{server.base}/***" in message
    assert "after 3 tries" in message
    assert "HTTP 503" in message
    assert SECRET not in records.text()


async def test_an_endpoint_that_answers_on_a_later_try_is_not_reported(records: Records) -> None:
    answers = iter([503, 502])
    server = PingServer(lambda _: next(answers, 200))
    pinger = AsyncPinger(FAST)
    try:
        pinger.send(start_ping("job", check_url(server), "R"))
        await pinger.close(10)
    finally:
        server.close()
    assert len(server.received) == 3
    assert not records.action("ping_failed")
    (sent,) = records.action("ping_sent")
    assert sent.levelno == logging.DEBUG


async def test_a_refusal_is_not_tried_again(records: Records) -> None:
    server = PingServer(lambda _: 404)
    pinger = AsyncPinger(FAST)
    try:
        pinger.send(start_ping("job", check_url(server), "R"))
        await pinger.close(10)
    finally:
        server.close()
    assert len(server.received) == 1
    (warning,) = records.action("ping_failed")
    assert "after 1 try (HTTP 404)" in warning.getMessage()


async def test_an_endpoint_that_never_answers_times_out_and_is_reported(
    records: Records,
) -> None:
    silent = SilentServer()
    pinger = AsyncPinger(PingPolicy(timeout_s=0.3, tries=2, backoff_s=0.01))
    try:
        pinger.send(start_ping("job", f"{silent.base}/ping/{SECRET}", "R"))
        await pinger.close(10)
    finally:
        silent.close()
    (warning,) = records.action("ping_failed")
    assert "after 2 tries (no answer within 0.3s)" in warning.getMessage()
    assert f"{silent.base}/***" in warning.getMessage()


async def test_a_refused_connection_is_reported_not_raised(records: Records) -> None:
    silent = SilentServer()
    url = f"{silent.base}/ping/{SECRET}"
    silent.close()  # nothing listens there now
    pinger = AsyncPinger(PingPolicy(timeout_s=2, tries=2, backoff_s=0.01))
    pinger.send(start_ping("job", url, "R"))
    await pinger.close(10)
    (warning,) = records.action("ping_failed")
    assert "refused" in warning.getMessage().lower()
    assert SECRET not in records.text()


async def test_closing_drops_what_is_still_pending_after_a_bounded_wait(
    records: Records,
) -> None:
    release = threading.Event()

    def answer(_: Received) -> int:
        release.wait(10)  # the endpoint hangs until the test ends
        return 200

    server = PingServer(answer)
    pinger = AsyncPinger(FAST)
    try:
        url = check_url(server)
        pinger.send(start_ping("job", url, "R"))
        pinger.send(finish_ping("job", url, "R", SUCCEEDED, exit_status=0))
        await wait_received(server, lambda got: got, "the start ping")
        await pinger.close(0.2)
        (dropped,) = records.action("ping_dropped")
        assert dropped.levelno == logging.WARNING
        assert f"2 ping(s) to {server.base}/*** dropped" in dropped.getMessage()
        pinger.send(start_ping("job", url, "S"))  # after closing: dropped, never raised
        assert len(records.action("ping_dropped")) == 2
        assert pinger.pending == 0
    finally:
        release.set()
        server.close()
    assert not records.action("ping_failed")


# -- the exec pinger (a thread) -------------------------------------------------------------
def test_the_thread_pinger_sends_in_order_and_close_waits_for_it(
    server: PingServer, records: Records
) -> None:
    url = check_url(server)
    pinger = Pinger(FAST)
    pinger.send(start_ping("job", url, "R"))
    pinger.send(finish_ping("job", url, "R", failed(None, "timed out"), exit_status=None))
    pinger.close(10)
    assert [(r.method, r.path, r.rid) for r in server.received] == [
        ("GET", f"/ping/{SECRET}/start", "R"),
        ("POST", f"/ping/{SECRET}/fail", "R"),
    ]
    assert server.received[1].body == b"timed out\n"


def test_the_thread_pinger_gives_a_silent_endpoint_a_bounded_wait(records: Records) -> None:
    silent = SilentServer()
    try:
        pinger = Pinger(PingPolicy(timeout_s=30, tries=3, backoff_s=0.01))
        pinger.send(start_ping("job", f"{silent.base}/ping/{SECRET}", "R"))
        pinger.close(0.2)
    finally:
        silent.close()
    (dropped,) = records.action("ping_dropped")
    assert f"1 ping(s) to {silent.base}/*** dropped" in dropped.getMessage()
    assert not records.action("ping_failed")


# -- the scheduler's runs --------------------------------------------------------------------
async def test_the_scheduler_pings_each_attempt_with_the_ledgers_run_id(
    server: PingServer, records: Records
) -> None:
    def ok(ctx: RunContext) -> None:
        pass

    def boom(ctx: RunContext) -> None:
        raise RuntimeError("boom")

    base = check_url(server)
    jobs = [
        job_spec("ok", where="t", every="200ms", call=ok, ping_url=f"{base}/ok"),
        job_spec("boom", where="t", every="200ms", call=boom, ping_url=f"{base}/boom"),
        job_spec(
            "exit3",
            where="t",
            every="200ms",
            command=["sh", "-c", "exit 3"],
            ping_url=f"{base}/exit3",
        ),
        job_spec(
            "slow",
            where="t",
            every="1s",
            command=["sleep", "5"],
            timeout="300ms",
            ping_url=f"{base}/slow",
        ),
        job_spec(
            "flaky",
            where="t",
            every="1s",
            call=boom,
            retries=1,
            retry_backoff="0s",
            ping_url=f"{base}/flaky",
        ),
    ]
    store = MemoryStore()

    def finished(job: str, **where: Any) -> bool:
        return any(
            r.state in ("succeeded", "failed") and all(getattr(r, k) == v for k, v in where.items())
            for r in ledger(store, job)
        )

    await run_replicas(
        store,
        jobs,
        lambda: (
            all(finished(j) for j in ("ok", "boom", "exit3", "slow"))
            and finished("flaky", attempt=2)
        ),
        replicas=1,
    )

    received = server.received
    expected = {
        "ok": ("GET", ""),
        "boom": ("POST", "/fail"),
        "exit3": ("POST", "/3"),
        "slow": ("POST", "/fail"),  # stopped by its timeout: not the signal's status
        "flaky": ("POST", "/fail"),  # the last attempt
    }
    for job, (method, suffix) in expected.items():
        path = f"/ping/{SECRET}/{job}"
        rows = [r for r in ledger(store, job) if r.state in ("succeeded", "failed")]
        if job == "flaky":
            rows = [r for r in rows if r.attempt == 2]
        assert rows, job
        for row in rows:
            pinged = [(r.method, r.path) for r in received if r.rid == row.run_id]
            assert pinged == [("GET", f"{path}/start"), (method, f"{path}{suffix}")], (job, row)
    bodies = {r.path: r.body for r in received}
    assert b"RuntimeError: boom" in bodies[f"/ping/{SECRET}/boom/fail"]
    assert b"timed out" in bodies[f"/ping/{SECRET}/slow/fail"]
    assert b"exit status 3" in bodies[f"/ping/{SECRET}/exit3/3"]
    # The flaky job's first attempts were only logged (/log), each paired with its start.
    logged = [r for r in received if r.path == f"/ping/{SECRET}/flaky/log"]
    assert logged
    for entry in logged:
        paths = [r.path for r in received if r.rid == entry.rid]
        assert paths == [f"/ping/{SECRET}/flaky/start", f"/ping/{SECRET}/flaky/log"]
    # Every ping belongs to an attempt the ledger knows, or to a retried first attempt.
    known = {row.run_id for job in expected for row in ledger(store, job)}
    assert {r.rid for r in received} <= known | {r.rid for r in logged}
    assert not records.action("ping_failed")
    assert SECRET not in records.text()
