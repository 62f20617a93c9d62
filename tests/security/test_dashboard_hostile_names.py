"""The dashboard with hostile job names: refusals logged safely, odd names reachable.

1. Log injection, before any token is checked (``fleetcron/web/app.py``, ``check``). A
   refused action is logged as ``dashboard: <action> of <name> refused: …`` where
   ``<name>`` is the raw path of the request when it is not a valid job name — control
   characters included. Anyone who can reach the dashboard writes a carriage return and
   terminal escapes into its text log: ``POST /api/jobs/x%0Dfleetcron:%20dashboard:%20pause
   %20report%1B%5B2K/pause`` logs a line that a terminal shows as ``fleetcron: dashboard:
   pause report`` (the refusal erased by ``ESC [2K``). JSON logs escape it; text logs do
   not. The name is now logged with ``%r``, as every message naming untrusted text is.

2. The dashboard cannot show, trigger or pause a job named ``.`` or ``..`` (``fleetcron
   exec --schedule ..`` registers one): ``render.job_path`` percent-encodes the name with
   ``quote(job, safe="")``, which leaves dots alone, so the link is ``/jobs/..`` — a
   browser resolves it to ``/`` before sending it — and the form posts to
   ``/jobs/../trigger``, i.e. ``/trigger`` (404). ``job_path`` now encodes the dots of a
   name that is all dots (``%2E``; the server decodes them back).
"""

from __future__ import annotations

import io
import json
import logging
import re
import unicodedata
import urllib.parse
from collections.abc import Iterator

import pytest

from fleetcron._log import TextFormatter
from fleetcron.stores.memory import AsyncMemoryStore, MemoryStore
from fleetcron.web import create_app
from fleetcron.web.app import LOOPBACK_HOSTS
from security.asgi import Asgi

TOKEN = "web-token-7d3f0a9c51b2e8e4"
DEFINITION = json.dumps({"schedule": {"kind": "every", "every_us": 60_000_000}, "timezone": "UTC"})
BASE = "http://127.0.0.1:8080/"


@pytest.fixture
def text_log() -> Iterator[io.StringIO]:
    """The ``fleetcron`` logger's records, formatted as ``fleetcron web`` writes them."""
    logger = logging.getLogger("fleetcron")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter(with_time=True))
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def _dashboard(*jobs: str) -> Asgi:
    store = MemoryStore()
    store.run(store.ops.job_register("ns", [(job, DEFINITION, "0" * 32) for job in jobs]))
    return Asgi(create_app(AsyncMemoryStore(store), "ns", TOKEN, allowed_hosts=LOOPBACK_HOSTS))


@pytest.mark.parametrize("api", [True, False], ids=["api", "form"])
def test_a_refused_action_logs_no_control_character_of_the_request(
    text_log: io.StringIO, api: bool
) -> None:
    forged = "x\rfleetcron: dashboard: pause report\x1b[2K"
    prefix = "/api" if api else ""
    url = f"{prefix}/jobs/{urllib.parse.quote(forged, safe='')}/pause"

    response = _dashboard("report").post(url)

    assert response.status_code in (401, 403, 404)  # refused (or no such job: a bad name)
    lines = text_log.getvalue().splitlines()
    assert any("refused" in line for line in lines), lines
    for line in lines:
        controls = [c for c in line if unicodedata.category(c) == "Cc"]
        assert not controls, f"a request wrote {controls!r} into the log: {line!r}"


@pytest.mark.parametrize("job", [".", ".."])
def test_the_dashboards_links_to_a_job_named_with_dots_reach_that_job(job: str) -> None:
    dashboard = _dashboard(job)
    index = dashboard.get("/").text
    [href] = re.findall(r'<a href="(/jobs/[^"]*)"', index)
    resolved = urllib.parse.urljoin(BASE, href)  # as a browser resolves it before sending

    page = dashboard.get(urllib.parse.urlsplit(resolved).path)

    assert page.status_code == 200, (href, resolved)
    assert f"<h1>{job} " in page.text, (href, resolved)  # the job's page, not the index
    form = re.findall(r'formaction="(/jobs/[^"]*/trigger)"', page.text)
    assert form, "the job's page has no trigger button"
    target = urllib.parse.urlsplit(urllib.parse.urljoin(BASE, form[0])).path
    refused = dashboard.post(target, content="token=wrong")
    assert refused.status_code == 403, (form[0], target)  # the job's own action, refused
