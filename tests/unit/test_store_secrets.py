"""The store's password never reaches what a run leaves behind: the output and error text
stored in the ledger, the daemon's echo of the output, the command's environment."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from fleetcron.context import RunContext
from fleetcron.environment import child_environment
from fleetcron.executor import Cancellation, _OutputTail, execute
from fleetcron.job_options import job_spec
from fleetcron.models import RunOutcome
from fleetcron.scrub import MASK, Scrubber, ScrubbingStream
from fleetcron.stores.ledger import OUTPUT_LIMIT
from unit import secret_jobs
from unit.secret_jobs import PASSWORD, URL

QUERY_URL = f"postgresql://postgres@db:5432/app?sslmode=require&password={PASSWORD}"


# -- what is masked -----------------------------------------------------------------------
def test_the_url_and_its_password_are_masked_wherever_they_occur() -> None:
    scrub = Scrubber(URL).scrub
    text = f"connecting to {URL}\npassword={PASSWORD}; again {PASSWORD}{PASSWORD}\n"
    assert scrub(text) == f"connecting to {MASK}\npassword={MASK}; again {MASK}{MASK}\n"


def test_a_password_in_the_query_is_masked_too() -> None:
    scrub = Scrubber(QUERY_URL).scrub
    assert scrub(f"{QUERY_URL} then {PASSWORD}") == f"{MASK} then {MASK}"


def test_a_percent_encoded_password_is_masked_as_written_and_decoded() -> None:
    scrub = Scrubber("postgresql://app:p%40ss%2Fw0rd@db/app").scrub
    assert scrub("p@ss/w0rd and p%40ss%2Fw0rd") == f"{MASK} and {MASK}"
    plus = Scrubber("postgresql://app@db/app?password=two+words").scrub
    assert plus("two words, two+words") == f"{MASK}, {MASK}"


@pytest.mark.parametrize(
    "url",
    [
        None,
        "",
        "sqlite:////var/lib/app/fleetcron.db",
        "memory://",
        "postgresql://postgres@127.0.0.1:5432/test",
        "postgresql://postgres:@127.0.0.1:5432/test",  # an empty password
    ],
)
def test_a_url_without_a_password_masks_nothing(url: str | None) -> None:
    text = f"the store is {url}; sqlite:////var/lib/app/fleetcron.db; postgres@127.0.0.1"
    assert Scrubber(url).scrub(text) == text
    assert Scrubber(url).scrub(text, cut=True) == text
    assert Scrubber(url).secrets == ()


def test_a_password_shorter_than_four_characters_is_masked_only_inside_the_url() -> None:
    # Masking every "a" of the output would destroy it and say which letter the password is.
    url = "postgresql://app:a@db/app"
    scrub = Scrubber(url).scrub
    assert scrub(f"a banana from {url}") == f"a banana from {MASK}"
    assert Scrubber("postgresql://app:abcd@db/app").scrub("abcd") == MASK  # four: masked


def test_an_outcome_has_its_error_and_output_masked() -> None:
    outcome = RunOutcome(state="failed", exit_code=3, error=f"bad {PASSWORD}", output=URL)
    masked = Scrubber(URL).outcome(outcome)
    assert (masked.state, masked.exit_code) == ("failed", 3)
    assert (masked.error, masked.output) == (f"bad {MASK}", MASK)
    assert Scrubber(URL).outcome(RunOutcome(state="succeeded")) == RunOutcome(state="succeeded")


# -- texts in pieces and texts cut short ------------------------------------------------------
@pytest.mark.parametrize("url", [URL, QUERY_URL, "postgresql://app:a@db/app"])
def test_a_secret_split_between_pieces_is_masked_whole(url: str) -> None:
    text = f"start {url} middle {PASSWORD} end {PASSWORD[:5]}\nlast"
    expected = Scrubber(url).scrub(text)
    for split in range(len(text) + 1):
        for second in (split, min(len(text), split + 3)):
            stream = ScrubbingStream(Scrubber(url))
            pieces = (text[:split], text[split:second], text[second:])
            passed = "".join(stream.feed(piece) for piece in pieces) + stream.close()
            assert passed == expected, (split, second)


def test_a_stream_holds_back_only_what_could_start_a_secret() -> None:
    stream = ScrubbingStream(Scrubber(URL))
    assert stream.feed("line one\n") == "line one\n"  # a whole line is never held
    assert stream.feed("then S3cr") == "then "
    assert stream.feed("etPassw0rd!\n") == f"{MASK}!\n"
    assert stream.feed("S3c") == ""
    assert stream.close() == "S3c"  # the text ended there: it was not a secret


def test_a_text_cut_inside_a_password_has_the_start_of_it_masked() -> None:
    scrubber = Scrubber(URL)
    assert scrubber.scrub(f"error: {PASSWORD[:6]}", cut=True) == f"error: {MASK}"
    assert scrubber.scrub(f"error: {URL[:30]}", cut=True) == f"error: {MASK}"  # as a URL is
    # Up to where the password starts, the URL says nothing secret.
    assert scrubber.scrub("error: postgresql://postgres:", cut=True) == (
        "error: postgresql://postgres:"
    )
    assert scrubber.scrub(f"error: {PASSWORD[:6]}", cut=False) == f"error: {PASSWORD[:6]}"
    short = Scrubber("postgresql://app:ab@db/app")
    assert short.scrub("at postgresql://app:a", cut=True) == f"at {MASK}"
    assert short.scrub("at postgresql://app:ab@d", cut=True) == f"at {MASK}"


def test_a_stream_no_longer_read_masks_the_start_of_a_secret_it_ends_with() -> None:
    stream = ScrubbingStream(Scrubber(URL))
    assert stream.feed(f"output {PASSWORD[:9]}") == "output "
    assert stream.close(cut=True) == MASK


class _Pipe:
    """A process's stdout that gives ``pieces`` read by read, then (``block``) hangs as a
    pipe a grandchild keeps open does, or ends."""

    def __init__(self, pieces: list[str], *, block: bool = False) -> None:
        self.pieces = [piece.encode() for piece in pieces]
        self.block = block

    async def read(self, _size: int) -> bytes:
        if self.pieces:
            return self.pieces.pop(0)
        if self.block:
            await asyncio.Event().wait()
        return b""


def _process(pipe: _Pipe) -> asyncio.subprocess.Process:
    class Process:
        stdout = pipe

    return cast(asyncio.subprocess.Process, Process())


@pytest.mark.parametrize("inside", [1, 5, len(PASSWORD) - 1])
async def test_the_stored_tail_never_keeps_part_of_a_password_cut_by_its_bound(
    inside: int,
) -> None:
    # Unmasked, the last 4 KiB would start `inside` characters into the password.
    after = "y" * (OUTPUT_LIMIT - (len(PASSWORD) - inside))
    text = "x" * 5000 + PASSWORD + after
    assert text[-OUTPUT_LIMIT:].startswith(PASSWORD[inside:])
    split = 5000 + inside  # and a read ends inside it too
    tail = _OutputTail("job", False, Scrubber(URL))
    await tail.pump(_process(_Pipe([text[:split], text[split:]])))
    stored = tail.text()
    assert stored == Scrubber(URL).scrub(text)[-OUTPUT_LIMIT:]
    assert stored.removesuffix(after).strip("x") in (MASK, MASK[1:], MASK[2:])  # may cut ***
    assert PASSWORD[inside:] not in stored


async def test_a_tail_no_longer_read_masks_the_start_of_a_password_it_ends_with() -> None:
    tail = _OutputTail("job", False, Scrubber(URL))
    reader = asyncio.create_task(tail.pump(_process(_Pipe([f"ok\n{PASSWORD[:7]}"], block=True))))
    while not tail.chunks:  # until it has read the piece (and waits on the next read)
        await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert tail.text() == f"ok\n{MASK}"


# -- the executor -------------------------------------------------------------------------
def _context(job: str) -> RunContext:
    logger = logging.LoggerAdapter(logging.getLogger(f"fleetcron.job.{job}"), {})
    return RunContext(
        job=job,
        namespace="secrets",
        slot_us=1_700_000_000_000_000,
        fence=1,
        attempt=1,
        run_id="run",
        trigger="schedule",
        logger=logger,
    )


async def _outcome(job: str, **options: Any) -> RunOutcome:
    spec = job_spec(job, where="test", every="1h", **options)
    execution = await execute(spec, _context(job), Cancellation(), backend_url=URL, echo=True)
    return execution.outcome


async def test_a_commands_output_is_stored_and_echoed_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = f"echo 'connect {URL}'; printf 'pw=%s\\n' '{PASSWORD}'; exit 3"
    outcome = await _outcome("leaky", command=["sh", "-c", script])
    assert (outcome.state, outcome.exit_code, outcome.error) == ("failed", 3, "exit status 3")
    assert outcome.output == f"connect {MASK}\npw={MASK}\n"
    echoed = capsys.readouterr().out
    assert echoed == f"[leaky] connect {MASK}\n[leaky] pw={MASK}\n"


async def test_a_functions_error_is_masked_before_it_is_bounded() -> None:
    def long_error(ctx: RunContext) -> None:
        raise RuntimeError("x" * (OUTPUT_LIMIT - len("RuntimeError: ") - 4) + PASSWORD)

    def leaky(ctx: RunContext) -> None:
        secret_jobs.leaks_the_url(ctx)

    outcome = await _outcome("leaky", call=leaky)
    assert outcome.error == f"RuntimeError: cannot connect to {MASK} (password {MASK})"
    outcome = await _outcome("long", call=long_error)
    assert outcome.error is not None
    assert outcome.error.endswith("x" + MASK)
    assert PASSWORD[:4] not in outcome.error


@pytest.mark.parametrize(
    ("function", "error"),
    [
        ("leaks_the_url", f"RuntimeError: cannot connect to {MASK} (password {MASK})"),
        ("leaks_across_the_cut", None),
    ],
)
async def test_an_isolated_jobs_failure_summary_is_masked(function: str, error: str | None) -> None:
    outcome = await _outcome(
        function, call=getattr(secret_jobs, function), isolate="process", lock_at_most="30s"
    )
    assert outcome.state == "failed"
    assert outcome.error is not None
    if error is not None:
        assert outcome.error == error
    else:  # cut by the child 8 characters into the password
        assert outcome.error.endswith("x" + MASK)
        assert PASSWORD[:8] not in outcome.error
    assert PASSWORD not in (outcome.output or "")  # the child's logged traceback


# -- the command's environment ----------------------------------------------------------------
def test_the_command_gets_neither_the_backend_nor_the_backend_file_variable() -> None:
    env = child_environment(
        {
            "FLEETCRON_BACKEND": URL,
            "FLEETCRON_BACKEND_FILE": "/run/secrets/fleetcron-backend",
            "DSN": f"host=db password={PASSWORD}",
            "KEEP": "kept",
        },
        URL,
        {"FLEETCRON_JOB": "job"},
    )
    assert env == {"KEEP": "kept", "FLEETCRON_JOB": "job"}


def test_a_query_password_in_a_variable_is_not_passed_on_either() -> None:
    env = child_environment({"A": f"x {PASSWORD}", "B": "b"}, QUERY_URL, {})
    assert env == {"B": "b"}
