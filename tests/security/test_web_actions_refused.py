"""The dashboard's actions (trigger, pause, resume), on every backend, for job names full of
metacharacters: without the token they are refused and change nothing — whatever form
the refusal takes — and with it they act on that very job, never on a lookalike.

Refused, each leaving the job rows, the ledger and the leases as they were:

- the API without ``Authorization``, with a wrong bearer token (fuzzed: near misses of the
  token, other case, other text), with the token under another scheme or none, in the
  query string, in a cookie, or in a form body (the API reads only the header);
- the page's form without the typed token, with a wrong one, with the token only in the
  query string, and a cross-site form post (``Origin``/``Referer`` of another site):
  nothing is kept in the browser, so the typed token is the only credential;
- with the right token, a request whose ``Host`` is not the loopback's (DNS rebinding);
- any method but ``POST`` on an action's address.

No response holds the dashboard's token, nor echoes the wrong one that was sent.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetcron.bridge import ThreadedAsyncStore
from fleetcron.models import job_lease_name
from fleetcron.stores import SyncStore
from fleetcron.web import create_app
from fleetcron.web.app import LOOPBACK_HOSTS
from security.asgi import Asgi
from security.fuzzing import budget, fuzz, job_names, lookalikes, name_problems, nfc

TOKEN = "web-token-7d3f0a9c51b2e8e4"
S = 1_000_000
DEFINITION = json.dumps({"schedule": {"kind": "every", "every_us": 60 * S}, "timezone": "UTC"})
ACTIONS = ("trigger", "pause", "resume")
EVIL = {
    "Origin": "https://evil.example",
    "Referer": "https://evil.example/page",
    "Sec-Fetch-Site": "cross-site",
}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
TOKEN_COOKIE = "fleetcron_token"

_printable = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
wrong_tokens = st.one_of(
    st.sampled_from(
        [
            "",
            TOKEN[:-1],
            TOKEN + "x",
            TOKEN.upper(),
            TOKEN[1:],
            TOKEN[:-1] + "5",
            f"{TOKEN},{TOKEN}",
            f'"{TOKEN}"',
            "null",
            "undefined",
            "*",
            "%",
        ]
    ),
    st.text(_printable, min_size=1, max_size=40),
).filter(lambda t: t.strip() != TOKEN)

REFUSALS = (
    "api: no header",
    "api: wrong bearer",
    "api: token under another scheme",
    "api: token in the query",
    "api: token in a cookie",
    "api: token in a form body",
    "form: no token",
    "form: wrong token",
    "form: token in the query",
    "form: cross-site without the token",
    "rebound host with the token",
)


def path(job: str, action: str, *, api: bool) -> str:
    """The address of ``action`` on ``job``; dots encoded too, so no client folds a ``..``."""
    quoted = urllib.parse.quote(job, safe="").replace(".", "%2E")
    return f"{'/api' if api else ''}/jobs/{quoted}/{action}"


def _request(kind: str, job: str, action: str, wrong: str) -> dict[str, Any]:
    """The refused request of ``kind``: the url, headers and body to ``POST``."""
    api = kind.startswith(("api", "rebound"))
    url = path(job, action, api=api)
    headers: dict[str, str] = {}
    body = b""
    if kind == "api: wrong bearer":
        headers["Authorization"] = f"Bearer {wrong}"
    elif kind == "api: token under another scheme":
        scheme = ["Basic", "Token", "Digest", ""][len(wrong) % 4]
        headers["Authorization"] = f"{scheme} {TOKEN}".strip()
    elif kind == "api: token in the query":
        name = ["token", "access_token", "api_key"][len(wrong) % 3]
        url += "?" + urllib.parse.urlencode({name: TOKEN})
    elif kind == "api: token in a cookie":
        headers["Cookie"] = f"token={TOKEN}; {TOKEN_COOKIE}={TOKEN}"
    elif kind in ("api: token in a form body", "form: wrong token"):
        headers.update(FORM)
        token = TOKEN if kind.startswith("api") else wrong
        body = urllib.parse.urlencode({"token": token}).encode()
    elif kind == "form: token in the query":
        headers.update(FORM)
        url += "?" + urllib.parse.urlencode({"token": TOKEN})
    elif kind == "form: cross-site without the token":
        headers.update({**FORM, **EVIL})
        body = urllib.parse.urlencode({"token": wrong}).encode() if len(wrong) % 2 else b""
    elif kind == "rebound host with the token":
        headers.update({"Authorization": f"Bearer {TOKEN}", "Host": "evil.example:8080"})
    return {"url": url, "headers": headers, "content": body}


@pytest.fixture
def app_for(store: SyncStore) -> Callable[[str], Asgi]:
    """``app_for(namespace)``: a client of the dashboard of ``namespace`` over the store
    under test, listening on the loopback as ``fleetcron web`` does by default."""

    def make(namespace: str) -> Asgi:
        async_store = ThreadedAsyncStore(store)
        return Asgi(create_app(async_store, namespace, TOKEN, allowed_hosts=LOOPBACK_HOSTS))

    return make


def _state(store: SyncStore, namespace: str, jobs: list[str]) -> object:
    """What an action could change: each job's row, its ledger, the leases (each record
    without ``now_us``, the time it was read)."""
    ops = store.ops
    rows = [store.run(ops.job_get(namespace, job)) for job in jobs]
    ledgers = [store.run(ops.run_list(namespace, job, 100)) for job in jobs]
    leases = store.run(ops.lease_list(namespace))
    return [
        [None if row is None else replace(row, now_us=0) for row in rows],
        [[replace(run, now_us=0) for run in ledger] for ledger in ledgers],
        [replace(lease, now_us=0) for lease in leases],
    ]


@st.composite
def _cases(draw: st.DrawFn) -> tuple[str, str, str, str, str]:
    job = draw(job_names())  # the dashboard serves job names only (≤ 186 characters)
    others = [
        nfc(f)
        for f in lookalikes(job)
        if not name_problems(job_lease_name(nfc(f))) and nfc(f) != job
    ]
    lookalike = (
        draw(st.sampled_from(others)) if others else ("y" if job[0] == "x" else "x") + job[1:]
    )
    action, kind = draw(st.sampled_from(ACTIONS)), draw(st.sampled_from(REFUSALS))
    return job, lookalike, action, kind, draw(wrong_tokens)


def _check(
    store: SyncStore, app_for: Callable[[str], Asgi], case: tuple[str, str, str, str, str]
) -> None:
    job, lookalike, action, kind, wrong = case
    namespace = "w" + uuid.uuid4().hex[:8]
    store.run(
        store.ops.job_register(namespace, [(j, DEFINITION, "0" * 32) for j in (job, lookalike)])
    )
    if action == "resume":  # both paused: resuming one must leave the other paused
        for name in (job, lookalike):
            store.run(store.ops.job_set_paused(namespace, name, True))
    client = app_for(namespace)
    before = _state(store, namespace, [job, lookalike])

    refused = client.post(**_request(kind, job, action, wrong))
    assert refused.status_code in (400, 401, 403), (kind, refused.status_code, refused.text)
    assert _state(store, namespace, [job, lookalike]) == before, kind
    assert TOKEN not in refused.text
    if len(wrong) >= 12:
        assert wrong not in refused.text, "the wrong token is echoed back"

    done = client.post(path(job, action, api=True), headers={"Authorization": f"Bearer {TOKEN}"})
    assert done.status_code in (200, 202), done.text
    assert done.json()["job"] == job
    assert TOKEN not in done.text
    rows = {name: store.run(store.ops.job_get(namespace, name)) for name in (job, lookalike)}
    queued = {
        name: [r for r in store.run(store.ops.run_list(namespace, name, 10)) if r.state == "queued"]
        for name in (job, lookalike)
    }
    paused = {name: row is not None and row.paused for name, row in rows.items()}
    if action == "trigger":
        assert [len(queued[job]), len(queued[lookalike])] == [1, 0]
        assert queued[job][0].trigger == "manual"
    else:
        assert paused == {job: action == "pause", lookalike: action == "resume"}


def test_an_action_without_the_token_is_refused_and_changes_nothing_and_with_it_acts_on_that_job(
    store: SyncStore, app_for: Callable[[str], Asgi], backend_url: str
) -> None:
    examples = budget(backend_url, sql=10, fast=30)
    fuzz(examples)(given(case=_cases())(_check))(store, app_for)


def test_no_method_but_post_acts_even_with_the_token(
    store: SyncStore, app_for: Callable[[str], Asgi]
) -> None:
    namespace = "w" + uuid.uuid4().hex[:8]
    store.run(store.ops.job_register(namespace, [("report", DEFINITION, "0" * 32)]))
    client = app_for(namespace)
    before = _state(store, namespace, ["report"])
    auth = {"Authorization": f"Bearer {TOKEN}", **FORM}
    for method in ("GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"):
        for action in ACTIONS:
            for url in (path("report", action, api=True), path("report", action, api=False)):
                response = client.request(method, url, headers=auth, content=f"token={TOKEN}")
                assert response.status_code in (404, 405), (method, url, response.status_code)
                assert TOKEN not in response.text
    assert _state(store, namespace, ["report"]) == before
