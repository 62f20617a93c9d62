"""The dashboard over a memory store: pages and JSON from one view model, actions behind
the token, and nothing changed by a refused one."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import TypeVar

import pytest
from starlette.testclient import TestClient

from fleetcron.errors import StoreUnavailable
from fleetcron.models import ReplicaInfo, RunOutcome, RunRecord, SlotClaim
from fleetcron.queue_models import QueueNack, QueuePut
from fleetcron.schedules import iso_utc
from fleetcron.status import read_status, status_json
from fleetcron.stores.base import Operation
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.testing import FakeClock
from fleetcron.web import create_app
from fleetcron.web.app import LOOPBACK_HOSTS, TOKEN_ENV
from fleetcron.web.render import sparkline

T = TypeVar("T")
NS = "web"
S = 1_000_000
MIN = 60 * S
T0 = 1_800_000_000 * S  # on a minute boundary
TOKEN = "a-long-random-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PAGE_SIZE = 50  # jobs on a page of the job list


def _definition(every_us: int = MIN, lock_at_most_us: int = 30 * S) -> str:
    schedule = {"kind": "every", "every_us": every_us}
    return json.dumps({"schedule": schedule, "timezone": "UTC", "lock_at_most_us": lock_at_most_us})


def _ran(store: MemoryStore, clock: FakeClock, job: str, *, took_s: float, ok: bool) -> None:
    """One run of ``job`` at the current minute's slot, taking ``took_s``."""
    slot = clock.wall_us() - clock.wall_us() % MIN
    claim = SlotClaim(job=job, slot_us=slot, run_id=f"{job}-{slot}")
    [answer] = store.run(store.ops.run_claim(NS, [claim], "host-a:17:secret-token", MIN))
    assert answer.run is not None
    clock.advance(took_s)
    outcome = RunOutcome(state="succeeded" if ok else "failed", exit_code=0 if ok else 3)
    store.run(store.ops.run_finish(NS, job, slot, answer.run.fence, outcome))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(wall_us=T0)


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    """Two jobs: ``report`` with five successes, ``export`` whose last run failed; one
    replica up."""
    store = MemoryStore(clock=clock)
    jobs = [("report", _definition(), "f" * 32), ("export", _definition(), "e" * 32)]
    store.run(store.ops.job_register(NS, jobs))
    for took in (2, 3, 5, 4, 6):
        clock.advance(60)
        _ran(store, clock, "report", took_s=took, ok=True)
    _ran(store, clock, "export", took_s=1, ok=False)
    info = ReplicaInfo(
        replica_id="host-a:17:0badcafe",
        host="host-a",
        pid=17,
        version="1.0",
        mode="claim",
        jobs_fingerprint="1" * 32,
    )
    store.run(store.ops.replica_beat(NS, info, 30 * S))
    return store


def _client(store: MemoryStore, token: str | None = TOKEN) -> Iterator[TestClient]:
    with TestClient(create_app(AsyncMemoryStore(store), NS, token)) as client:
        yield client


@pytest.fixture
def client(store: MemoryStore) -> Iterator[TestClient]:
    yield from _client(store)


@pytest.fixture
def readonly(store: MemoryStore) -> Iterator[TestClient]:
    yield from _client(store, None)


def _runs(store: MemoryStore, job: str) -> list[RunRecord]:
    return store.run(store.ops.run_list(NS, job, 50))


def test_api_status_is_status_json_of_the_same_store(
    store: MemoryStore, client: TestClient
) -> None:
    response = client.get("/api/status")
    assert response.status_code == 200
    expected = status_json(store.run(read_status(store.ops, NS)))
    assert response.json() == json.loads(json.dumps(expected))
    assert [job["job"] for job in response.json()["jobs"]] == ["export", "report"]  # worst first
    assert response.json()["replicas"][0]["replica_id"] == "host-a:17:0badcafe"


def test_the_runs_api_lists_the_ledger_newest_first_without_the_holders_secret(
    client: TestClient,
) -> None:
    rows = client.get("/api/jobs/report/runs").json()
    assert [row["duration_s"] for row in rows] == [6, 4, 5, 3, 2]
    assert {row["holder"] for row in rows} == {"host-a:17"}
    assert "secret" not in json.dumps(rows)
    assert len(client.get("/api/jobs/report/runs?limit=2").json()) == 2
    assert client.get("/api/jobs/report/runs?limit=0").status_code == 400


def test_trigger_with_the_token_queues_a_run_the_ledger_shows(
    store: MemoryStore, client: TestClient
) -> None:
    response = client.post("/api/jobs/report/trigger", headers=AUTH)
    assert response.status_code == 202
    answer = response.json()
    assert answer["queued"] is True
    assert answer["state"] == "queued"
    newest = _runs(store, "report")[0]
    assert (newest.state, newest.trigger) == ("queued", "manual")
    ledger = client.get("/api/jobs/report/runs").json()[0]
    assert (ledger["slot"], ledger["state"]) == (answer["slot"], "queued")
    page = client.get("/jobs/report").text
    assert 'data-state="queued"' in page


def test_a_trigger_at_a_slot_queues_it_once(store: MemoryStore, client: TestClient) -> None:
    url = "/api/jobs/export/trigger?slot=2027-01-15T08:00:00Z"
    first = client.post(url, headers=AUTH)
    again = client.post(url, headers=AUTH)
    assert (first.status_code, first.json()["queued"]) == (202, True)
    assert (again.status_code, again.json()["queued"], again.json()["state"]) == (
        200,
        False,
        "queued",
    )
    assert [run.state for run in _runs(store, "export")].count("queued") == 1
    future = client.post("/api/jobs/export/trigger?slot=2099-01-01T00:00:00Z", headers=AUTH)
    assert future.status_code == 400
    assert "has not come yet" in future.json()["error"]
    bad = client.post("/api/jobs/export/trigger?slot=yesterday", headers=AUTH)
    assert bad.status_code == 400


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["none", "wrong", "not-bearer"],
)
def test_an_action_without_the_right_token_is_refused_and_changes_nothing(
    store: MemoryStore, client: TestClient, headers: dict[str, str]
) -> None:
    before = _runs(store, "report")
    for action in ("trigger", "pause", "resume", "cancel"):
        response = client.post(f"/api/jobs/report/{action}", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "token" in response.json()["error"]
    assert _runs(store, "report") == before
    job = store.run(store.ops.job_get(NS, "report"))
    assert job is not None
    assert not job.paused


def test_without_a_configured_token_actions_are_refused_and_no_form_is_shown(
    store: MemoryStore, readonly: TestClient
) -> None:
    for action in ("trigger", "cancel"):
        response = readonly.post(f"/api/jobs/report/{action}", headers=AUTH)
        assert response.status_code == 403
        assert TOKEN_ENV in response.json()["error"]
    form = readonly.post("/jobs/report/trigger", data={"token": TOKEN})
    assert form.status_code == 403
    page = readonly.get("/jobs/report").text
    assert "<form" not in page
    assert "Trigger now" not in page
    assert _runs(store, "report")[0].state == "succeeded"


def test_pause_and_resume_are_stored_for_every_replica(
    store: MemoryStore, client: TestClient
) -> None:
    paused = client.post("/api/jobs/report/pause", headers=AUTH)
    assert paused.json() == {"job": "report", "paused": True}
    job = store.run(store.ops.job_get(NS, "report"))
    assert job is not None
    assert job.paused
    report = next(j for j in client.get("/api/status").json()["jobs"] if j["job"] == "report")
    assert report["state"] == "paused"
    assert ">Resume<" in client.get("/jobs/report").text
    resumed = client.post("/api/jobs/report/resume", headers=AUTH)
    assert resumed.json() == {"job": "report", "paused": False}
    job = store.run(store.ops.job_get(NS, "report"))
    assert job is not None
    assert not job.paused


def test_an_unknown_job_is_404_on_every_route(client: TestClient) -> None:
    assert client.get("/api/jobs/nosuch/runs").json() == {
        "error": "no job named 'nosuch' in namespace 'web'"
    }
    for path in ("/api/jobs/nosuch/runs", "/jobs/nosuch", "/jobs/%20bad"):
        assert client.get(path).status_code == 404
    for action in ("trigger", "pause", "resume", "cancel"):
        response = client.post(f"/api/jobs/nosuch/{action}", headers=AUTH)
        assert response.status_code == 404
        assert "no job named 'nosuch'" in response.json()["error"]
    page = client.get("/jobs/nosuch")
    assert "There is no job named 'nosuch' in namespace 'web'" in page.text
    assert client.get("/api/nothing").json() == {"error": "no page at /api/nothing"}


def test_the_form_acts_only_with_the_typed_token(store: MemoryStore, client: TestClient) -> None:
    refused = client.post("/jobs/report/trigger", data={"token": "guess"})
    assert refused.status_code == 403
    assert "Refused: the token is wrong" in refused.text
    assert "<script>" not in refused.text  # a refusal does not reload (and post again)
    assert _runs(store, "report")[0].state == "succeeded"
    done = client.post("/jobs/report/trigger", data={"token": TOKEN}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"] == "/jobs/report?done=queued"
    assert _runs(store, "report")[0].state == "queued"
    shown = client.get(done.headers["location"]).text
    assert "Queued a run" in shown
    paused = client.post("/jobs/report/pause", data={"token": TOKEN}, follow_redirects=False)
    assert paused.headers["location"] == "/jobs/report?done=paused"


def _running(store: MemoryStore, clock: FakeClock, job: str) -> int:
    """A running attempt of ``job`` at the next minute's slot, its lease valid for 10
    minutes; its slot."""
    clock.advance(60)
    slot = clock.wall_us() - clock.wall_us() % MIN
    claim = SlotClaim(job=job, slot_us=slot, run_id=f"{job}-{slot}")
    [answer] = store.run(store.ops.run_claim(NS, [claim], "host-a:17:secret-token", 10 * MIN))
    assert answer.run is not None
    return slot


def test_cancel_with_the_token_asks_the_running_attempt_noting_the_client(
    store: MemoryStore, client: TestClient, clock: FakeClock
) -> None:
    idle = client.post("/api/jobs/report/cancel", headers=AUTH)
    assert idle.status_code == 200
    assert idle.json() == {"job": "report", "slot": None, "asked": 0, "by": "web:testclient"}
    assert "Cancel run" not in client.get("/jobs/report").text
    before = _runs(store, "report")

    slot = _running(store, clock, "report")
    assert 'formaction="/jobs/report/cancel"' in client.get("/jobs/report").text
    earlier = iso_utc(slot - MIN)  # that slot's attempt has finished: it is not asked
    finished = client.post(f"/api/jobs/report/cancel?slot={earlier}", headers=AUTH)
    assert (finished.status_code, finished.json()["asked"]) == (200, 0)
    response = client.post(f"/api/jobs/report/cancel?slot={iso_utc(slot)}", headers=AUTH)
    assert response.status_code == 202
    assert response.json() == {
        "job": "report",
        "slot": iso_utc(slot),
        "asked": 1,
        "by": "web:testclient",
    }
    row = store.run(store.ops.run_get(NS, "report", slot))
    assert row is not None
    assert (row.state, row.cancel_requested, row.error) == (
        "running",
        True,
        "cancelled by web:testclient",
    )
    kept = [dataclasses.replace(run, now_us=0) for run in _runs(store, "report")[1:]]
    assert kept == [dataclasses.replace(run, now_us=0) for run in before], "no other changed"
    bad = client.post("/api/jobs/report/cancel?slot=yesterday", headers=AUTH)
    assert (bad.status_code, bad.json()) == (
        400,
        {"error": "slot: 'yesterday' is not an ISO 8601 time"},
    )


def test_the_cancel_button_acts_only_with_the_typed_token(
    store: MemoryStore, client: TestClient, clock: FakeClock
) -> None:
    slot = _running(store, clock, "export")

    def asked() -> bool:
        row = store.run(store.ops.run_get(NS, "export", slot))
        assert row is not None
        return row.cancel_requested

    refused = client.post("/jobs/export/cancel", data={"token": "guess"})
    assert refused.status_code == 403
    assert "Refused: the token is wrong" in refused.text
    assert not asked()
    done = client.post("/jobs/export/cancel", data={"token": TOKEN}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"] == "/jobs/export?done=cancelling"
    assert asked()
    assert "Asked the running attempt to stop" in client.get(done.headers["location"]).text

    store.run(store.ops.run_finish(NS, "export", slot, _fence(store, "export", slot), _CANCELLED))
    again = client.post("/jobs/export/cancel", data={"token": TOKEN}, follow_redirects=False)
    assert again.headers["location"] == "/jobs/export?done=idle"
    page = client.get(again.headers["location"]).text
    assert "nothing was cancelled" in page
    assert "Cancel run" not in page
    assert 'class="badge s-cancelled"' in page


_CANCELLED = RunOutcome(state="cancelled", exit_code=-15, error="cancelled by web:testclient")


def _fence(store: MemoryStore, job: str, slot: int) -> int:
    row = store.run(store.ops.run_get(NS, job, slot))
    assert row is not None
    return row.fence


def test_the_pages_show_jobs_worst_first_with_their_state_and_durations(
    client: TestClient,
) -> None:
    page = client.get("/")
    assert page.status_code == 200
    text = page.text
    assert text.index('data-job="export"') < text.index('data-job="report"')
    assert 'data-state="overdue"' in text  # registered 5 minutes ago, never succeeded
    assert 'data-state="ok"' in text
    assert text.count('class="spark"') == 1  # only report has successful durations
    assert 'data-replica="host-a:17:0badcafe"' in text
    assert "secret-token" not in text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "frame-ancestors 'none'" in csp
    leases = client.get("/leases").text
    assert 'data-lease="fleetcron:job:report"' in leases
    assert client.get("/api/leases").json()[0]["holder"] == "host-a:17"


def test_names_from_the_store_are_escaped(store: MemoryStore, client: TestClient) -> None:
    evil = '<script>alert("x")</script>/../?#'
    store.run(store.ops.job_register(NS, [(evil, _definition(), "0" * 32)]))
    index = client.get("/").text
    assert '<script>alert("x")' not in index
    assert "&lt;script&gt;" in index
    href = "/jobs/%3Cscript%3Ealert%28%22x%22%29%3C%2Fscript%3E%2F..%2F%3F%23"
    assert href in index
    page = client.get(href)
    assert page.status_code == 200
    assert "&lt;script&gt;alert" in page.text


def test_a_replica_on_other_definitions_is_noted(store: MemoryStore, client: TestClient) -> None:
    for pid, fingerprint in ((18, "1" * 32), (19, "2" * 32)):
        info = ReplicaInfo(
            replica_id=f"host-b:{pid}:feed",
            host="host-b",
            pid=pid,
            version="1.0",
            mode="claim",
            jobs_fingerprint=fingerprint,
        )
        store.run(store.ops.replica_beat(NS, info, 30 * S))
    status = client.get("/api/status").json()
    assert [r["differs"] for r in status["replicas"]] == [False, False, True]
    assert status["notes"] == [
        "replica host-b:19:feed runs other job definitions than 2 other live replica(s) "
        "(jobs fingerprint 222222222222)"
    ]
    assert "runs other job definitions" in client.get("/").text


class _DownStore:
    """A store whose every operation fails as an unreachable one does."""

    def __init__(self, store: MemoryStore) -> None:
        self.ops = store.ops
        self.url = "memory://"
        self.capabilities = store.capabilities

    async def run(self, operation: Operation[T]) -> T:
        operation.close()
        raise StoreUnavailable("connection refused")

    async def migrate(self) -> list[str]:
        return []

    async def close(self) -> None:
        return None


def test_an_unreachable_store_is_503_with_the_reason(store: MemoryStore) -> None:
    with TestClient(create_app(_DownStore(store), NS, TOKEN)) as client:
        api = client.get("/api/status")
        assert api.status_code == 503
        assert "connection refused" in api.json()["error"]
        page = client.get("/")
        assert page.status_code == 503
        assert "Store unavailable" in page.text


def test_the_sparkline_draws_the_durations_under_lock_at_most() -> None:
    svg = sparkline([2 * S, 4 * S, 3 * S], 8 * S)
    assert svg.startswith("<svg")
    assert 'class="limit"' in svg
    assert 'y1="3.0"' in svg  # lock_at_most is the top of the scale
    assert "polyline" in svg
    assert "3 successful run(s): last 3s, longest 4s; lock_at_most 8s" in svg
    assert "polyline" not in sparkline([S], None)
    assert "svg" not in sparkline([], 8 * S)


def test_a_dashboard_on_the_loopback_answers_only_localhost_names(store: MemoryStore) -> None:
    app = create_app(AsyncMemoryStore(store), NS, TOKEN, allowed_hosts=LOOPBACK_HOSTS)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        assert client.get("/api/status").status_code == 200
        assert client.get("/api/status", headers={"Host": "localhost:8080"}).status_code == 200
        rebound = client.get("/api/status", headers={"Host": "attacker.example:8080"})
        assert rebound.status_code == 400


def test_the_index_shows_each_queue_with_its_dead_items(
    store: MemoryStore, client: TestClient
) -> None:
    assert "Queues" not in client.get("/").text, "no queue, no section"
    puts = [QueuePut(payload=str(n), max_attempts=1) for n in range(3)]
    store.run(store.ops.queue_put(NS, "mail<x>", puts))
    (first,) = store.run(store.ops.queue_claim(NS, "mail<x>", "w", 1, 30 * S))
    nack = QueueNack(item_id=first.item_id, fence=first.fence, error="bounced")
    assert store.run(store.ops.queue_nack(NS, "mail<x>", [nack])) == ["dead"]

    page = client.get("/").text
    queues = page.split("<h2>Queues</h2>")[1]

    assert 'data-queue="mail&lt;x&gt;"' in queues, "the name escaped"
    assert "1 dead" in queues
    status = client.get("/api/status").json()
    assert status["queues"][0]["queue"] == "mail<x>"
    assert (status["queues"][0]["ready"], status["queues"][0]["dead"]) == (2, 1)


def _many(store: MemoryStore, count: int) -> list[str]:
    """``count`` more jobs, registered just now (``ok``): names sort after the fixture's."""
    names = [f"sweep-{index:03d}" for index in range(count)]
    store.run(store.ops.job_register(NS, [(name, _definition(), "0" * 32) for name in names]))
    return names


def _rows(page: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)"', page)


def test_the_job_list_is_paged_worst_first_with_links_between_pages(
    store: MemoryStore, client: TestClient
) -> None:
    names = _many(store, 2 * PAGE_SIZE + 10)  # three pages with the fixture's two jobs
    everything = [job["job"] for job in client.get("/api/status").json()["jobs"]]
    assert everything[:2] == ["export", "report"]  # overdue first, then the ok ones by name

    first = client.get("/").text
    assert _rows(first) == everything[:PAGE_SIZE]
    assert "jobs 1–50 of 112 · page 1 of 3" in first
    assert '<a href="/?page=2" rel="next" data-page="2">next ›</a>' in first
    assert '<a href="/?page=3" data-page="3">last »</a>' in first
    assert "‹ previous" in first  # shown, not a link, on the first page
    assert 'rel="prev"' not in first
    assert 'data-filter="overdue"' in first  # each count shows those jobs
    assert "112 job(s)" in first

    last = client.get("/?page=3").text
    assert _rows(last) == everything[2 * PAGE_SIZE :] == names[-12:]
    assert '<a href="/?page=2" rel="prev" data-page="2">‹ previous</a>' in last
    assert 'rel="next"' not in last
    past = client.get("/?page=9")
    assert past.status_code == 200
    assert _rows(past.text) == []
    assert "No jobs on this page: the list has 3 page(s)." in past.text
    assert '<a href="/?page=3" rel="prev" data-page="3">‹ previous</a>' in past.text


def test_the_job_list_filters_by_state_and_keeps_the_filter_from_page_to_page(
    store: MemoryStore, client: TestClient
) -> None:
    _many(store, 2 * PAGE_SIZE)
    ok = client.get("/?state=ok&page=2").text
    assert len(_rows(ok)) == PAGE_SIZE  # 101 ok jobs: 50, 50, 1
    assert "export" not in _rows(ok)
    assert _rows(client.get("/?state=ok&page=3").text) == ["sweep-099"]
    assert '<a href="/?state=ok&amp;page=3" rel="next" data-page="3">next ›</a>' in ok
    assert '<a href="/?state=ok" rel="prev" data-page="1">‹ previous</a>' in ok
    assert 'aria-current="true" data-filter="ok"' in ok
    assert '<a href="/" data-filter="all">show all</a>' in ok
    trouble = client.get("/?state=failing,overdue").text
    assert _rows(trouble) == ["export"]
    assert client.get("/?state=stuck").text.count("No job is in that state now.") == 1
    # The page reloads itself as it is: only a shown notice leaves the address.
    assert "location.reload()" in ok
    assert 'u.searchParams.delete("done")' in ok


def test_api_status_pages_when_asked_and_counts_every_job_in_every_answer(
    store: MemoryStore, client: TestClient
) -> None:
    _many(store, 10)
    everything = client.get("/api/status").json()
    assert everything["page"] is None
    assert len(everything["jobs"]) == everything["total"] == 12
    assert everything["totals"]["ok"] == 11
    assert everything["totals"]["overdue"] == 1

    page = client.get("/api/status?limit=3&offset=2&state=ok").json()
    assert page["page"] == {"offset": 2, "limit": 3, "state": ["ok"], "matched": 11}
    assert [job["job"] for job in page["jobs"]] == [job["job"] for job in everything["jobs"][3:6]]
    assert page["totals"] == everything["totals"]
    assert page["healthy"] is False  # export is overdue, on this page or not
    repeated = client.get("/api/status?state=overdue&state=ok&limit=1").json()
    assert repeated["page"]["state"] == ["overdue", "ok"]
    assert [job["job"] for job in repeated["jobs"]] == ["export"]
    rest = client.get("/api/status?offset=10").json()
    assert [job["job"] for job in rest["jobs"]] == [job["job"] for job in everything["jobs"][10:]]
    assert rest["page"]["limit"] is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit must be a whole number from 1 to 1000, not '0'"),
        ("limit=1001", "limit must be a whole number from 1 to 1000, not '1001'"),
        ("limit=ten", "limit must be a whole number from 1 to 1000, not 'ten'"),
        ("limit=", "limit must be a whole number from 1 to 1000, not ''"),
        ("offset=-1", "offset must be a whole number of at least 0, not '-1'"),
        ("offset=" + "9" * 40, "offset must be a whole number of at least 0, not '999"),
        ("state=late", "state must be one or more of overdue, stuck, failing, unknown, running"),
    ],
)
def test_bad_paging_parameters_are_refused_with_what_is_wanted(
    client: TestClient, query: str, message: str
) -> None:
    response = client.get(f"/api/status?{query}")
    assert response.status_code == 400
    assert response.json()["error"].startswith(message)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("page=0", "page must be a whole number of at least 1, not '0'"),
        ("page=last", "page must be a whole number of at least 1, not 'last'"),
        ("state=OK", "state must be one or more of"),
    ],
)
def test_a_bad_page_of_the_job_list_is_a_400_page_that_says_why(
    client: TestClient, query: str, message: str
) -> None:
    response = client.get(f"/?{query}")
    assert response.status_code == 400
    assert message in response.text
