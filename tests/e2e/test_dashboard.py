"""The dashboard in a real browser (Debian's chromium driven by Playwright): ``fleetcron
web`` over a SQLite store, and ``fleetcron run --web`` beside a running fleet.

Under ``CI=true`` a missing chromium or Playwright fails these tests instead of skipping
them. Every wait is on a condition — the store's ledger, the page's content — never a fixed
sleep. ``FLEETCRON_UPDATE_SCREENSHOT=1`` writes the fleet's dashboard to
docs/img/dashboard.png.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from e2e.helpers import Cli, assert_clean_error, wait_for
from fleetcron.cli.exitcodes import EXIT_USAGE
from fleetcron.health import JobHealth
from fleetcron.models import RunOutcome, SlotClaim
from fleetcron.status import read_status
from fleetcron.stores import SyncStore, open_store, parse_store_url
from ports import spare_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
TOKEN = "e2e-dashboard-token-0123456789"
TOKEN_ENV = "FLEETCRON_WEB_TOKEN"
S = 1_000_000
MIN = 60 * S
SCREENSHOT = Path(__file__).parents[2] / "docs" / "img" / "dashboard.png"


def _require(ok: bool, message: str) -> None:
    """Skip without ``ok`` — fail under CI=true, where the browser must be there."""
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Debian's chromium (``apt-get install chromium``; scripts/test installs it)."""
    _require(Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _require(False, "playwright is missing: pip install -e '.[dev]'")
        raise
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def store(sqlite_cli: Cli) -> Iterator[SyncStore]:
    """The test's SQLite store, opened by the test itself to prepare and to watch it."""
    opened = open_store(parse_store_url(sqlite_cli.backend))
    yield opened
    opened.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _definition(every_us: int, **extra: int) -> str:
    return json.dumps({"schedule": {"kind": "every", "every_us": every_us}, "timezone": "UTC",
                       **extra})  # fmt: skip


def _health(store: SyncStore, namespace: str) -> dict[str, JobHealth]:
    status = store.run(read_status(store.ops, namespace))
    return {health.job: health for health in status.jobs}


def _past_run(store: SyncStore, namespace: str, job: str, minutes_ago: int, ok: bool) -> None:
    """A finished run of ``job`` in the ledger, at the slot ``minutes_ago`` minutes back."""
    now = store.run(store.ops.store_now())
    slot = now - now % MIN - minutes_ago * MIN
    claim = SlotClaim(job=job, slot_us=slot, run_id=f"{job}-{minutes_ago}")
    [answer] = store.run(store.ops.run_claim(namespace, [claim], "e2e-host:4242:secret", MIN))
    assert answer.run is not None, answer
    outcome = RunOutcome(
        state="succeeded" if ok else "failed",
        exit_code=0 if ok else 3,
        error=None if ok else "exit status 3: upstream timed out",
    )
    assert store.run(store.ops.run_finish(namespace, job, slot, answer.run.fence, outcome))


def test_the_dashboard_lists_the_jobs_and_triggers_only_with_the_token(
    sqlite_cli: Cli, store: SyncStore, browser: Browser
) -> None:
    from playwright.sync_api import expect

    namespace = sqlite_cli.namespace
    jobs = [
        ("report", _definition(MIN, lock_at_most_us=5 * MIN), "r" * 32),
        ("export", _definition(MIN), "e" * 32),
        ("heartbeat", _definition(S, grace_us=S), "h" * 32),  # nobody runs it: overdue soon
    ]
    store.run(store.ops.job_register(namespace, jobs))
    for minutes_ago in (3, 2, 1):
        _past_run(store, namespace, "report", minutes_ago, ok=True)
    _past_run(store, namespace, "export", 1, ok=False)
    wait_for(lambda: _health(store, namespace)["heartbeat"].state == "overdue", timeout=30)

    port = spare_port()
    url = f"http://127.0.0.1:{port}/"
    web = sqlite_cli.spawn("web", "--listen", f"127.0.0.1:{port}", env={TOKEN_ENV: TOKEN})
    wait_for(lambda: _answers(url) or web.poll() is not None, timeout=30, what="the dashboard")
    assert web.poll() is None, web.wait().stderr

    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(url)
    rows = page.locator("tbody tr[data-job]")
    expect(rows).to_have_count(3)
    assert [rows.nth(i).get_attribute("data-job") for i in range(3)] == [
        "heartbeat",
        "export",
        "report",
    ]  # worst first
    for job, state in (("heartbeat", "overdue"), ("export", "failing"), ("report", "ok")):
        cell = page.locator(f'tr[data-job="{job}"] td[data-state]')
        expect(cell).to_have_attribute("data-state", state)
    expect(page.locator('tr[data-job="report"] svg.spark')).to_have_count(1)

    page.get_by_role("link", name="export", exact=True).click()
    expect(page.locator("h1")).to_contain_text("export")
    ledger = page.locator("tbody tr[data-state]")
    expect(ledger).to_have_count(1)
    expect(ledger.first).to_have_attribute("data-state", "failed")

    def ledger_states() -> list[str]:
        return [run.state for run in store.run(store.ops.run_list(namespace, "export", 10))]

    for typed in ("", "not-the-token"):  # without the token, then with a wrong one
        page.goto(f"{url}jobs/export")
        page.fill("input[name=token]", typed)
        page.get_by_role("button", name="Trigger now").click()
        expect(page.locator(".refused")).to_contain_text("Refused")
        assert ledger_states() == ["failed"]

    page.goto(f"{url}jobs/export")
    page.fill("input[name=token]", TOKEN)
    page.get_by_role("button", name="Trigger now").click()
    expect(page.locator(".notice")).to_contain_text("Queued a run")
    expect(ledger).to_have_count(2)
    expect(ledger.first).to_have_attribute("data-state", "queued")
    assert ledger_states() == ["queued", "failed"]
    newest = store.run(store.ops.run_list(namespace, "export", 1))[0]
    assert newest.trigger == "manual"

    # A running attempt: its job's page offers Cancel, which asks it to stop (its replica
    # then stops it), noting who asked.
    now = store.run(store.ops.store_now())
    claim = SlotClaim(job="report", slot_us=now - now % MIN, run_id="running", exclusive=False)
    [answer] = store.run(store.ops.run_claim(namespace, [claim], "e2e-host:4242:s", 10 * MIN))
    assert answer.run is not None, answer

    def asked() -> tuple[bool, str | None]:
        row = store.run(store.ops.run_get(namespace, "report", claim.slot_us))
        assert row is not None
        return row.cancel_requested, row.error

    page.goto(f"{url}jobs/report")
    page.fill("input[name=token]", "not-the-token")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".refused")).to_contain_text("Refused")
    assert asked() == (False, None)
    page.goto(f"{url}jobs/report")
    page.fill("input[name=token]", TOKEN)
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".notice")).to_contain_text("Asked the running attempt to stop")
    assert asked() == (True, "cancelled by web:127.0.0.1")

    web.proc.send_signal(signal.SIGTERM)
    assert web.wait(timeout=30).returncode == 0


REPORT = "import random, time; time.sleep(random.uniform(0.1, 0.8))"
FLEET = f"""
[jobs.report]
every = "1s"
command = [{json.dumps(sys.executable)}, "-c", "{REPORT}"]
lock_at_most = "2s"

[jobs.sync-invoices]
every = "2s"
command = ["sh", "-c", "echo upstream timed out >&2; exit 3"]

[jobs.nightly-backup]
schedule = "30 2 * * *"
timezone = "Europe/Berlin"
command = ["true"]
"""


@pytest.mark.parametrize("namespace", ["production"])  # the screenshot's; the store is the test's
def test_run_web_serves_the_dashboard_of_a_running_fleet(
    sqlite_cli: Cli, store: SyncStore, browser: Browser, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    namespace = sqlite_cli.namespace
    legacy = ("legacy-import", _definition(2 * S, grace_us=S), "l" * 32)  # no replica runs it
    store.run(store.ops.job_register(namespace, [legacy]))
    jobs_file = tmp_path / "jobs.toml"
    jobs_file.write_text(FLEET)
    port = spare_port()
    url = f"http://127.0.0.1:{port}/"
    env = {TOKEN_ENV: TOKEN}
    daemon = sqlite_cli.spawn("run", str(jobs_file), "--web", f"127.0.0.1:{port}", env=env)
    other = sqlite_cli.spawn("run", str(jobs_file))
    wait_for(lambda: _answers(url) or daemon.poll() is not None, timeout=30, what="dashboard")
    assert daemon.poll() is None, daemon.wait().stderr

    wait_for(lambda: "nightly-backup" in _health(store, namespace), timeout=30)
    assert sqlite_cli.run("pause", "nightly-backup").returncode == 0

    def settled() -> bool:
        health = _health(store, namespace)
        status = store.run(read_status(store.ops, namespace))
        return (
            len(health["report"].durations_us) >= 8
            and health["sync-invoices"].state == "failing"
            and health["legacy-import"].state == "overdue"
            and health["nightly-backup"].state == "paused"
            and sum(replica.alive for replica in status.replicas) == 2
        )

    wait_for(settled, timeout=60, interval=0.2, what="the fleet to run its jobs")

    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(url)
    expect(page.locator("tbody tr[data-job]")).to_have_count(4)
    for job, states in (
        ("legacy-import", "overdue"),
        ("sync-invoices", "failing"),
        ("nightly-backup", "paused"),
        ("report", "ok|running"),
    ):
        cell = page.locator(f'tr[data-job="{job}"] td[data-state]')
        expect(cell).to_have_attribute("data-state", re.compile(f"^({states})$"))
    expect(page.locator("tbody tr[data-replica]")).to_have_count(2)
    expect(page.locator('tr[data-job="report"] svg.spark polyline')).to_have_count(1)
    api = page.request.get(f"{url}api/status").json()
    assert {job["job"] for job in api["jobs"]} == {
        "legacy-import",
        "sync-invoices",
        "nightly-backup",
        "report",
    }
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("FLEETCRON_UPDATE_SCREENSHOT"):
        SCREENSHOT.write_bytes(shot.read_bytes())

    page.goto(f"{url}leases")
    expect(page.locator('tr[data-lease="fleetcron:job:report"]')).to_have_count(1)

    for replica in (daemon, other):
        replica.proc.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60).returncode == 0
    assert other.wait(timeout=60).returncode == 0
    assert not _answers(url)


def test_a_port_in_use_or_a_bad_address_starts_nothing(
    sqlite_cli: Cli, store: SyncStore, tmp_path: Path
) -> None:
    jobs_file = tmp_path / "jobs.toml"
    jobs_file.write_text(FLEET)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        web = sqlite_cli.run("web", "--listen", taken)
        assert_clean_error(web, EXIT_USAGE, f"--listen {taken}: cannot listen there")
        run = sqlite_cli.run("run", str(jobs_file), "--web", taken, "--metrics", "127.0.0.1:0")
        assert_clean_error(run, EXIT_USAGE, f"--web {taken}: cannot listen there")
    bad = sqlite_cli.run("web", "--listen", "localhost")
    assert_clean_error(bad, EXIT_USAGE, "--listen must be HOST:PORT")
    # The daemon never started: it registered no job and never beat.
    assert store.run(store.ops.job_list(sqlite_cli.namespace)) == []
    assert store.run(store.ops.replica_list(sqlite_cli.namespace)) == []
