"""The dashboard's pages, rendered from the view model (:class:`~fleetcron.status.FleetStatus`)
and the ledger, with the pieces of :mod:`fleetcron.web.layout`. Times are the store's
clock, shown in UTC; everything from the store is escaped (:mod:`fleetcron.web.markup`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import urlencode

from fleetcron.health import JobHealth
from fleetcron.models import LeaseRecord, ReplicaRecord, RunRecord, display_holder
from fleetcron.queue_models import QueueStats
from fleetcron.status import FINGERPRINT_SHOWN, ORDER, FleetStatus, run_duration_us
from fleetcron.web.layout import (
    CSP,
    REFRESH_S,
    badge,
    document,
    duration,
    job_path,
    relative,
    sparkline,
    table,
    when,
)
from fleetcron.web.markup import Html, el, join

__all__ = [
    "CSP",
    "REFRESH_S",
    "error_page",
    "index_page",
    "index_path",
    "job_page",
    "job_path",
    "leases_page",
    "sparkline",
]

_RUN_STATES = {
    "succeeded", "failed", "lost", "cancelled", "running", "queued", "skipped", "missed"
}  # fmt: skip


# -- the pages ---------------------------------------------------------------------------
def _job_row(health: JobHealth, now_us: int) -> Html:
    last = health.last_run
    running = health.running
    said = [reason for reason in health.reasons if reason != health.state]  # not "paused"
    reasons = el("ul", [el("li", reason) for reason in said], class_="reasons") if said else None
    return el(
        "tr",
        el("td", el("a", health.job, href=job_path(health.job))),
        el("td", badge(health.state), reasons, class_="wrap", data_state=health.state),
        el("td", health.schedule, class_="small wrap"),
        el(
            "td",
            relative(health.next_slot_us, now_us),
            el("div", when(health.next_slot_us, now_us), class_="muted small"),
        ),
        el(
            "td",
            "-" if last is None else join(when(last.slot_us, now_us), " ", badge(last.state)),
        ),
        el("td", relative(health.last_success_us, now_us)),
        el(
            "td",
            "-"
            if running is None
            else join(
                el("span", display_holder(running.holder), class_="mono"),
                el("div", f"for {duration(health.lease_age_us)}", class_="muted small"),
            ),
        ),
        el("td", sparkline(health.durations_us, health.lock_at_most_us)),
        data_job=health.job,
    )


def _replica_row(replica: ReplicaRecord, differs: bool) -> Html:
    state = badge("up") if replica.alive else badge("gone")
    return el(
        "tr",
        el("td", replica.replica_id, class_="mono"),
        el("td", replica.mode),
        el("td", state, " ", badge("differs") if differs else None),
        el("td", replica.version),
        el("td", when(replica.started_us)),
        el("td", relative(replica.last_seen_us, replica.now_us)),
        el(
            "td",
            replica.jobs_fingerprint[:FINGERPRINT_SHOWN],
            class_="mono",
            title=replica.jobs_fingerprint,
        ),
        data_replica=replica.replica_id,
    )


def _queue_row(queue: QueueStats) -> Html:
    waiting = "-" if queue.oldest_us is None else duration(queue.oldest_age_us)
    return el(
        "tr",
        el("td", queue.queue, class_="mono"),
        el("td", str(queue.ready)),
        el("td", str(queue.scheduled)),
        el("td", str(queue.claimed)),
        el("td", str(queue.done)),
        el("td", badge(f"{queue.dead} dead", "failing") if queue.dead else "0"),
        el("td", waiting),
        data_queue=queue.queue,
    )


def _leader(status: FleetStatus) -> Html:
    leader = status.leader
    if leader is None:
        return el("span", "leader: none (claim mode, or no replica holds it)", class_="muted")
    return el(
        "span",
        "leader: ",
        el("b", leader.holder_display, class_="mono"),
        f" (fence {leader.fence}, since ",
        relative(leader.acquired_us, status.now_us),
        ")",
    )


def index_path(number: int = 1, states: Iterable[str] | None = None) -> str:
    """The address of page ``number`` (1 is the first) of the job list, of the jobs in
    ``states`` only (every job when ``None``)."""
    query = []
    if states:
        query.append(("state", ",".join(state for state in ORDER if state in states)))
    if number > 1:
        query.append(("page", str(number)))
    return "/" + ("?" + urlencode(query, safe=",") if query else "")


def _filters(status: FleetStatus) -> Html:
    """Every job counted by state, worst first: each count shows those jobs only."""
    chosen: frozenset[str] | None = status.page.states if status.page is not None else None
    links = [
        el(
            "a",
            badge(f"{count:,} {state}", state),
            # The filter of one state shows it alone; again, every job.
            href=index_path(1, None if chosen == frozenset({state}) else {state}),
            class_="filter",
            aria_current="true" if chosen is not None and state in chosen else None,
            data_filter=state,
        )
        for state, count in status.totals.items()
        if count
    ]
    every = el("a", "show all", href=index_path(), data_filter="all") if chosen else None
    return join(el("span", f"{status.total:,} job(s)"), links, every)


def _pager(status: FleetStatus) -> Html | None:
    """Which jobs the page shows, and the way to the others: first, previous, next, last."""
    page = status.page
    if page is None or not page.limit:
        return None
    size, matched = page.limit, status.matched
    number, last = page.offset // size + 1, max(1, -(-matched // size))
    shown = (
        f"jobs {page.offset + 1:,}–{page.offset + len(status.jobs):,} of {matched:,}"
        if status.jobs
        else f"{matched:,} job(s)"
    )

    def step(label: str, target: int, rel: str | None = None) -> Html:
        if target == number or not 1 <= target <= last:
            return el("span", label, class_="muted")
        return el("a", label, href=index_path(target, page.states), rel=rel, data_page=target)

    return el(
        "nav",
        step("« first", 1),
        step("‹ previous", min(number - 1, last), "prev"),  # from past the end: the last
        el("span", f"{shown} · page {number:,} of {last:,}"),
        step("next ›", number + 1, "next"),
        step("last »", last),
        class_="pager",
        aria_label="pages of jobs",
    )


def _no_jobs(status: FleetStatus) -> str:
    page = status.page
    if status.total == 0:
        return f"No jobs in namespace {status.namespace!r}: jobs register when a replica runs."
    if status.matched == 0:
        return "No job is in that state now."
    size = page.limit if page is not None and page.limit else status.matched
    return f"No jobs on this page: the list has {-(-status.matched // size):,} page(s)."


def index_page(status: FleetStatus) -> str:
    """``/``: the jobs worst first, a page at a time (``status`` is a paged read), every
    job counted by state; the leader; the replicas."""
    summary = el("div", _filters(status), _leader(status), class_="summary")
    header = ("Job", "State", "Schedule", "Next slot", "Last run", "Last success", "Holder",
              "Durations")  # fmt: skip
    rows = [_job_row(health, status.now_us) for health in status.jobs]
    pager = _pager(status)
    jobs = join(pager, table(header, rows, _no_jobs(status)), pager if rows else None)
    differing = status.differing_replicas
    replicas = table(
        ("Replica", "Mode", "State", "Version", "Started", "Last beat", "Jobs"),
        [_replica_row(r, r.replica_id in differing) for r in status.replicas],
        "No replica has beaten in the last 10 minutes.",
    )
    body = join(
        el("h1", "Jobs"),
        summary,
        [el("div", note, class_="note") for note in status.notes],
        jobs,
        el("h2", "Replicas"),
        replicas,
        *(
            [
                el("h2", "Queues"),
                table(
                    ("Queue", "Ready", "Scheduled", "Claimed", "Done", "Dead", "Oldest waiting"),
                    [_queue_row(queue) for queue in status.queues],
                    "",
                ),
            ]
            if status.queues
            else []
        ),
    )
    return document("Jobs", status.namespace, status.now_us, body, current="/")


def _at(moment_us: int | None, now_us: int) -> Html:
    """``2026-12-01 07:37:12Z (4m ago)``."""
    if moment_us is None:
        return Html("-")
    return join(when(moment_us), " ", el("span", "(", relative(moment_us, now_us), ")",
                                          class_="muted"))  # fmt: skip


def _facts(health: JobHealth, now_us: int) -> Html:
    running = health.running
    facts: list[tuple[str, object]] = [
        ("Schedule", health.schedule),
        ("Next slot", _at(health.next_slot_us, now_us)),
        ("Expected slot", when(health.expected_slot_us)),
        ("Grace", duration(health.grace_us)),
        ("Last success", _at(health.last_success_us, now_us)),
        ("Last failure", _at(health.last_failure_us, now_us)),
        (
            "Running",
            "-"
            if running is None
            else join(
                el("span", display_holder(running.holder), class_="mono"),
                f" for {duration(health.lease_age_us)} (fence {running.fence})",
            ),
        ),
        ("lock_at_most", duration(health.lock_at_most_us)),
        ("Stuck after", duration(health.stuck_after_us)),
        ("p95 duration", duration(health.p95_duration_us)),
        ("Durations", sparkline(health.durations_us, health.lock_at_most_us, width=240)),
    ]
    return el(
        "dl",
        [join(el("dt", name), el("dd", value)) for name, value in facts],
        class_="facts card",
    )


def _actions(health: JobHealth) -> Html:
    """One form, the token typed in it, a button per action: nothing is stored in the
    browser, so a page of another site cannot make it act (docs/operations.md). Cancel is
    there while an attempt runs: it asks every running attempt of the job to stop."""
    toggle = "resume" if health.paused else "pause"
    cancel = (
        el(
            "button",
            "Cancel run",
            type="submit",
            class_="danger",
            formaction=job_path(health.job, "cancel"),
            title="ask the running attempt to stop: it is recorded cancelled by web:<address>",
        )
        if health.running is not None
        else None
    )
    return el(
        "form",
        el(
            "input",
            type="password",
            name="token",
            placeholder="FLEETCRON_WEB_TOKEN",
            autocomplete="current-password",
            aria_label="token",
        ),
        el("button", "Trigger now", type="submit", formaction=job_path(health.job, "trigger")),
        el(
            "button",
            toggle.capitalize(),
            type="submit",
            class_="secondary",
            formaction=job_path(health.job, toggle),
        ),
        cancel,
        method="post",
        action=job_path(health.job, "trigger"),
        class_="actions card",
    )


def _ledger_row(run: RunRecord) -> Html:
    return el(
        "tr",
        el("td", when(run.slot_us)),
        el("td", badge(run.state, run.state if run.state in _RUN_STATES else "other")),
        el("td", display_holder(run.holder) or "-", class_="mono"),
        el("td", run.attempt),
        el("td", run.fence or "-"),
        el("td", run.trigger),
        el("td", when(run.started_us)),
        el("td", duration(run_duration_us(run))),
        el("td", "-" if run.exit_code is None else run.exit_code),
        el("td", run.error or "", class_="wrap small"),
        data_state=run.state,
    )


NOTICES = {
    "queued": "Queued a run; a replica claims it within a few seconds.",
    "exists": "That slot already has a ledger row: nothing was queued.",
    "paused": "Paused on every replica.",
    "resumed": "Resumed on every replica.",
    "cancelling": "Asked the running attempt to stop: its replica stops it within about a "
    "second and records it cancelled.",
    "idle": "No attempt of this job was running: nothing was cancelled.",
}


def job_page(
    status: FleetStatus,
    health: JobHealth,
    runs: Sequence[RunRecord],
    *,
    actions: bool,
    notice: str | None = None,
    refused: str | None = None,
) -> str:
    """``/jobs/NAME``: the job's health, its actions (with a token configured) and its
    ledger, newest slot first. ``notice``: a key of :data:`NOTICES`; ``refused``: why an
    action was refused (the page then does not reload itself)."""
    body = join(
        el("p", el("a", "← all jobs", href="/"), class_="small"),
        el("h1", health.job, " ", badge(health.state)),
        el("div", NOTICES[notice], class_="notice", role="status") if notice in NOTICES else None,
        el("div", refused, class_="refused", role="alert") if refused else None,
        el("ul", [el("li", reason) for reason in health.reasons], class_="reasons")
        if health.reasons
        else None,
        _facts(health, status.now_us),
        join(el("h2", "Actions"), _actions(health)) if actions else None,
        el("h2", "Ledger"),
        table(
            (
                "Slot",
                "Outcome",
                "Replica",
                "Attempt",
                "Fence",
                "Trigger",
                "Started",
                "Duration",
                "Exit",
                "Error",
            ),
            [_ledger_row(run) for run in runs],
            "No ledger rows yet.",
        ),
    )
    return document(health.job, status.namespace, status.now_us, body, refresh=refused is None)


def _lease_row(lease: LeaseRecord) -> Html:
    held = lease.held
    return el(
        "tr",
        el("td", lease.name, class_="mono"),
        el("td", badge("held", "running") if held else badge("free", "other")),
        el("td", lease.holder_display if held else "-", class_="mono"),
        el("td", lease.fence),
        el("td", duration(lease.now_us - lease.acquired_us) if held else "-"),
        el("td", duration(lease.expires_us - lease.now_us) if held else "-"),
        el("td", when(lease.acquired_us)),
        data_lease=lease.name,
    )


def leases_page(status: FleetStatus) -> str:
    """``/leases``: every lease row of the namespace, held or free (but the monitor's
    alert markers, which :func:`~fleetcron.status.read_status` keeps apart)."""
    body = join(
        el("h1", "Leases"),
        el("p", _leader(status), class_="summary"),
        table(
            ("Name", "State", "Holder", "Fence", "Held for", "Expires in", "Acquired"),
            [_lease_row(lease) for lease in status.leases],
            "No leases in this namespace.",
        ),
    )
    return document("Leases", status.namespace, status.now_us, body, current="/leases")


def error_page(namespace: str, now_us: int | None, title: str, message: str) -> str:
    """A page that says what is wrong (an unknown job, the store unreachable)."""
    body = join(el("h1", title), el("p", message), el("p", el("a", "← all jobs", href="/")))
    return document(title, namespace, now_us, body, refresh=False)
