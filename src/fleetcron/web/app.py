"""The dashboard as an ASGI application: :func:`create_app`.

Every request reads the store afresh (one operation: :func:`~fleetcron.status.read_status`,
plus the ledger on a job's page); the pages and the JSON come from the same view model, and
``/api/status`` is exactly ``fleetcron status --json``. The job list is paged
(:data:`PAGE_SIZE` jobs, worst first, ``?page=N&state=S,...``), and so is ``/api/status``
when asked (``?limit=N&offset=N&state=S,...``; by default it holds every job): a page
reads the ledger of its own jobs only (:class:`~fleetcron.status.Page`).

Actions (trigger, pause, resume, cancel) need the token the dashboard was started with:
``Authorization: Bearer <token>`` on the API, the token typed into the job page's form on
the page. Nothing is kept in the browser — no cookie, no session — so a page of another site
has no credential to borrow, and forging a request needs the token itself: the form is
CSRF-safe without a CSRF token. Without a configured token, every action is refused (403)
and the pages show no form. A cancel is recorded as asked by ``web:<client address>``
(:mod:`fleetcron.cancel_request`).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from fleetcron._log import log
from fleetcron.cancel_request import cancel_note, cancel_runs
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.health import JobHealth, JobState
from fleetcron.models import RunRecord
from fleetcron.names import validate_job_name
from fleetcron.schedules import iso_utc, parse_instant
from fleetcron.status import (
    ORDER,
    FleetStatus,
    Page,
    lease_json,
    read_status,
    run_json,
    shown_leases,
    status_json,
)
from fleetcron.stores.base import AsyncStore, Operation, Operations
from fleetcron.web import render

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")

__all__ = ["LOOPBACK_HOSTS", "MAX_STATUS_LIMIT", "PAGE_SIZE", "TOKEN_ENV", "create_app"]

TOKEN_ENV = "FLEETCRON_WEB_TOKEN"
LEDGER_ROWS = 50  # ledger rows a job's page and /runs show unless ?limit= says otherwise
MAX_LEDGER_ROWS = 1000
PAGE_SIZE = 50  # jobs on a page of the job list
MAX_STATUS_LIMIT = 1000  # jobs in a page of /api/status (without ?limit=, every job)
_DIGITS = 12  # a count or a position longer than this is refused before int() reads it
_FORM_LIMIT = 4096  # bytes: a form holds one token
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class _Refused(Exception):
    """An action without the right token: ``status`` 401 or 403, ``message`` says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _job_view(
    ops: Operations, namespace: str, job: str, limit: int
) -> Operation[tuple[FleetStatus, JobHealth | None, list[RunRecord]]]:
    # As one page: no lease rows but the leader's (a namespace holds one per job).
    status = yield from read_status(ops, namespace, [job], queues=False, page=Page())
    health = next((h for h in status.jobs if h.job == job), None)
    runs = (yield from ops.run_list(namespace, job, limit)) if health is not None else []
    return status, health, runs


def _trigger(
    ops: Operations, namespace: str, job: str, slot_us: int | None
) -> Operation[tuple[int, bool, RunRecord | None] | None]:
    """Queue a manual run of ``job`` at ``slot_us`` (the store's now when ``None``), as
    ``fleetcron trigger`` does: ``None`` for an unknown job; else the slot, whether a run
    was queued, and the slot's row when it already had one (a slot that has no row and
    got none has not come yet)."""
    if (yield from ops.job_get(namespace, job)) is None:
        return None
    slot = slot_us if slot_us is not None else (yield from ops.store_now())
    if (yield from ops.run_record(namespace, job, slot, "queued", None, "manual")):
        return slot, True, None
    return slot, False, (yield from ops.run_get(namespace, job, slot))


def _json(content: object, status: int = 200, **headers: str) -> JSONResponse:
    return JSONResponse(content, status_code=status, headers={**_SECURITY_HEADERS, **headers})


def _html(content: str, status: int = 200) -> HTMLResponse:
    headers = {**_SECURITY_HEADERS, "Content-Security-Policy": render.CSP}
    return HTMLResponse(content, status_code=status, headers=headers)


def _job_name(request: Request) -> str | None:
    try:
        return validate_job_name(request.path_params["name"])
    except ConfigurationError:
        return None  # no job can have that name


def _limit(request: Request) -> int:
    text = request.query_params.get("limit", "")
    if not text:
        return LEDGER_ROWS
    if not text.isdigit() or not 1 <= int(text) <= MAX_LEDGER_ROWS:
        raise HTTPException(400, f"limit must be a whole number from 1 to {MAX_LEDGER_ROWS}")
    return int(text)


def _whole(request: Request, name: str, low: int, high: int | None = None) -> int | None:
    """The query parameter ``name`` as a whole number from ``low`` to ``high`` (``None``
    when absent); anything else is a 400 that says what is wanted."""
    text = request.query_params.get(name)
    if text is None:
        return None
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= _DIGITS else -1
    if number < low or (high is not None and number > high):
        wanted = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise HTTPException(400, f"{name} must be a whole number {wanted}, not {text!r}")
    return number


def _states(request: Request) -> frozenset[JobState] | None:
    """The ``state`` filter: states, comma-separated or repeated (``None``: every state)."""
    asked = [
        word.strip()
        for value in request.query_params.getlist("state")
        for word in value.split(",")
        if word.strip()
    ]
    if not asked:
        return None
    known: dict[str, JobState] = {state: state for state in ORDER}
    unknown = [word for word in asked if word not in known]
    if unknown:
        raise HTTPException(
            400, f"state must be one or more of {', '.join(ORDER)}, not {unknown[0]!r}"
        )
    return frozenset(known[word] for word in asked)


def _status_page(request: Request) -> Page | None:
    """The part of the jobs ``/api/status`` was asked for: ``None`` (every job) without
    ``limit``, ``offset`` and ``state``."""
    limit = _whole(request, "limit", 1, MAX_STATUS_LIMIT)
    offset = _whole(request, "offset", 0)
    states = _states(request)
    if limit is None and offset is None and states is None:
        return None
    return Page(states=states, offset=offset or 0, limit=limit)


def _list_page(request: Request) -> Page:
    """The page of the job list ``/`` was asked for (``?page=N``, 1 the first)."""
    number = _whole(request, "page", 1) or 1
    return Page(states=_states(request), offset=(number - 1) * PAGE_SIZE, limit=PAGE_SIZE)


def _slot(request: Request) -> int | None:
    text = request.query_params.get("slot")
    if text is None:
        return None
    try:
        return parse_instant(text, "slot")
    except ConfigurationError as exc:
        raise HTTPException(400, exc.message) from None


def _requester(request: Request) -> str:
    """Who asks, as a cancel records it: ``web:`` and the client's address (behind a
    proxy, the proxy's)."""
    host = request.client.host if request.client is not None else "unknown"
    return f"web:[{host}]" if ":" in host else f"web:{host}"


async def _form_token(request: Request) -> str | None:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_LIMIT:
            raise HTTPException(413, "the form is too large")
    values = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return values.get("token", [None])[0]


def _bearer(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def create_app(
    store: AsyncStore,
    namespace: str,
    token: str | None = None,
    *,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of ``namespace`` over ``store`` (left open: its owner closes it).

    ``token``: what actions must present (``None`` or empty: actions are refused).
    ``allowed_hosts``: the ``Host`` headers answered (``None``: any) — a dashboard on the
    loopback answers only ``localhost`` names, so a web page cannot reach it through a
    DNS name rebound to 127.0.0.1 and read it.
    Pages: ``/`` (``?page=N``, ``?state=S,...``), ``/jobs/{name}``, ``/leases``. API:
    ``GET /api/status`` (``?limit=N``, ``?offset=N``, ``?state=S,...``; every job without
    them), ``GET /api/leases``, ``GET /api/jobs/{name}/runs``, ``POST
    /api/jobs/{name}/trigger`` (``?slot=ISO`` optional), ``POST /api/jobs/{name}/pause``,
    ``.../resume``, ``POST /api/jobs/{name}/cancel`` (``?slot=ISO`` optional: that
    attempt only).
    """
    secret = token.encode() if token else None
    ops = store.ops

    def check(given: str | None, action: str, job: str) -> None:
        """Refuse an action without the right token, and log the refusal."""
        problem: _Refused | None = None
        if secret is None:
            problem = _Refused(
                403, f"actions are disabled: the dashboard was started without {TOKEN_ENV}"
            )
        elif not given:
            problem = _Refused(401, "this action needs the dashboard's token")
        elif not hmac.compare_digest(given.encode(), secret):
            problem = _Refused(401, "the token is wrong")
        if problem is not None:
            log.warning(
                # %r: the name comes from the request, so no control character of it
                # reaches a text log (it could forge a line or move the cursor).
                "dashboard: %s of %r refused: %s",
                action,
                job,
                problem.message,
                extra={"action": "web_action_refused", "job": job, "verb": action},
            )
            raise problem

    async def act(action: str, job: str, slot_us: int | None, by: str) -> dict[str, object] | None:
        """Carry out ``action`` (a cancel as asked by ``by``); ``None`` when the job is
        unknown."""
        if action == "cancel":
            note = cancel_note(by)
            asked = await store.run(cancel_runs(ops, namespace, job, slot_us, note))
            if asked is None:
                return None
            shown = None if slot_us is None else iso_utc(slot_us)
            result: dict[str, object] = {"job": job, "slot": shown, "asked": asked, "by": by}
        elif action == "trigger":
            done = await store.run(_trigger(ops, namespace, job, slot_us))
            if done is None:
                return None
            slot, queued, existing = done
            if not queued and existing is None:
                raise ConfigurationError(
                    f"the slot {iso_utc(slot)} has not come yet on the store's clock"
                )
            result = {
                "job": job,
                "slot": iso_utc(slot),
                "queued": queued,
                "state": "queued" if existing is None else existing.state,
            }
        else:
            paused = action == "pause"
            # The dashboard acts on the jobs it shows: a pause ahead of a job's deploy is
            # the CLI's (`fleetcron pause`), not a URL's.
            if paused and await store.run(ops.job_get(namespace, job)) is None:
                return None
            if not await store.run(ops.job_set_paused(namespace, job, paused)):
                return None
            result = {"job": job, "paused": paused}
        log.info(
            "dashboard: %s %s",
            action,
            job,
            extra={"action": f"web_{action}", **result},
        )
        return result

    # -- pages -----------------------------------------------------------------------------
    async def index(request: Request) -> Response:
        status = await store.run(read_status(ops, namespace, page=_list_page(request)))
        return _html(render.index_page(status))

    async def leases(request: Request) -> Response:
        status = await store.run(read_status(ops, namespace, []))  # no job's ledger
        return _html(render.leases_page(status))

    async def job_page(request: Request, *, refused: _Refused | None = None) -> Response:
        job, limit = _job_name(request), _limit(request)
        if job is None:
            return _not_found_page(request, None)
        status, health, runs = await store.run(_job_view(ops, namespace, job, limit))
        if health is None:
            return _not_found_page(request, status.now_us)
        page = render.job_page(
            status,
            health,
            runs,
            actions=secret is not None,
            notice=request.query_params.get("done"),
            refused=None if refused is None else f"Refused: {refused.message}. Nothing changed.",
        )
        # A refused form is 403: 401 would promise an Authorization challenge it has not.
        return _html(page, 200 if refused is None else 403)

    def _not_found_page(request: Request, now_us: int | None) -> Response:
        name = request.path_params["name"]
        message = f"There is no job named {name!r} in namespace {namespace!r}."
        return _html(render.error_page(namespace, now_us, "No such job", message), 404)

    def form_action(action: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            job = _job_name(request)
            try:
                check(await _form_token(request), action, job or request.path_params["name"])
            except _Refused as refused:
                return await job_page(request, refused=refused)
            slot = _slot(request) if action == "cancel" else None
            by = _requester(request)
            result = None if job is None else await act(action, job, slot, by)
            if job is None or result is None:
                return _not_found_page(request, None)
            if action == "cancel":
                notice = "cancelling" if result["asked"] else "idle"
            elif action == "trigger":
                notice = "queued" if result["queued"] else "exists"
            else:
                notice = "paused" if action == "pause" else "resumed"
            target = f"{render.job_path(job)}?done={notice}"
            return RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)

        return handle

    # -- the API ---------------------------------------------------------------------------
    async def api_status(request: Request) -> Response:
        page = _status_page(request)
        return _json(status_json(await store.run(read_status(ops, namespace, page=page))))

    async def api_leases(request: Request) -> Response:
        leases = shown_leases(await store.run(ops.lease_list(namespace)))  # no alert markers
        return _json([lease_json(lease) for lease in leases])

    async def api_runs(request: Request) -> Response:
        job, limit = _job_name(request), _limit(request)
        if job is None:
            return _unknown_job(request)
        _status, health, runs = await store.run(_job_view(ops, namespace, job, limit))
        if health is None:
            return _unknown_job(request)
        return _json([run_json(run) for run in runs])

    def _unknown_job(request: Request) -> Response:
        name = request.path_params["name"]
        return _json({"error": f"no job named {name!r} in namespace {namespace!r}"}, 404)

    def api_action(action: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            job = _job_name(request)
            try:
                check(_bearer(request), action, job or request.path_params["name"])
            except _Refused as refused:
                challenge = {"WWW-Authenticate": 'Bearer realm="fleetcron"'}
                headers = challenge if refused.status == 401 else {}
                return _json({"error": refused.message}, refused.status, **headers)
            slot = _slot(request) if action in ("trigger", "cancel") else None
            try:
                result = None if job is None else await act(action, job, slot, _requester(request))
            except ConfigurationError as exc:
                return _json({"error": exc.message}, 400)
            if result is None:
                return _unknown_job(request)
            # Accepted: a queued run, or attempts asked to stop (they stop within a second).
            status = 202 if result.get("queued") or result.get("asked") else 200
            return _json(result, status)

        return handle

    # -- errors ----------------------------------------------------------------------------
    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = exc.status_code
        detail = f"no page at {request.url.path}" if code == 404 else exc.detail
        if wants_json(request):
            return _json({"error": detail}, code)
        try:
            title = HTTPStatus(code).phrase
        except ValueError:
            title = "Error"
        return _html(render.error_page(namespace, None, title, detail), code)

    async def store_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StoreError)
        log.warning(
            "dashboard: %s",
            exc,
            extra={"action": "web_store_error", "path": request.url.path},
        )
        message = f"the store could not be read: {exc}"
        if wants_json(request):
            return _json({"error": message}, 503)
        return _html(render.error_page(namespace, None, "Store unavailable", message), 503)

    actions = ("trigger", "pause", "resume", "cancel")
    routes = [
        Route("/", index, methods=["GET"]),
        Route("/leases", leases, methods=["GET"]),
        Route("/api/status", api_status, methods=["GET"]),
        Route("/api/leases", api_leases, methods=["GET"]),
        Route("/api/jobs/{name:path}/runs", api_runs, methods=["GET"]),
        *(Route(f"/api/jobs/{{name:path}}/{a}", api_action(a), methods=["POST"]) for a in actions),
        *(Route(f"/jobs/{{name:path}}/{a}", form_action(a), methods=["POST"]) for a in actions),
        Route("/jobs/{name:path}", job_page, methods=["GET"]),
    ]
    handlers: dict[Any, Any] = {HTTPException: http_error, StoreError: store_error}
    middleware = (
        [Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
        if allowed_hosts is not None
        else []
    )
    return Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)
