"""The dashboard's pages, rendered from the view model (:class:`~fleetcron.status.FleetStatus`)
and the ledger. Times are the store's clock, shown in UTC; everything from the store is
escaped (:mod:`fleetcron.web.markup`). One stylesheet and one short script, both inline:
the page loads nothing from anywhere else.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from urllib.parse import quote

from fleetcron.durations import format_duration
from fleetcron.health import JobHealth
from fleetcron.models import LeaseRecord, ReplicaRecord, RunRecord, display_holder
from fleetcron.queue_models import QueueStats
from fleetcron.schedules import iso_utc
from fleetcron.status import FINGERPRINT_SHOWN, FleetStatus, run_duration_us
from fleetcron.web.markup import Html, el, join

__all__ = [
    "CSP",
    "REFRESH_S",
    "error_page",
    "index_page",
    "job_page",
    "job_path",
    "leases_page",
    "sparkline",
]

REFRESH_S = 5

_STYLE = """
:root{--fg:#1d2330;--muted:#5f6b7a;--line:#e3e7ee;--bg:#f6f8fb;--card:#fff;--ok:#1a7f37;
--run:#0b62c4;--bad:#c62828;--warn:#b25e00;--idle:#6e7781;--accent:#3d4db7}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg)}
header{display:flex;flex-wrap:wrap;gap:.4rem 1.5rem;align-items:baseline;padding:.8rem 1.5rem;
background:#1d2330;color:#e8ecf3}
header a{color:#e8ecf3;text-decoration:none}
header .brand{font-weight:700;font-size:1.1rem;letter-spacing:.02em}
header nav{display:flex;gap:1rem}
header nav a{opacity:.8}
header nav a:hover,header nav a[aria-current]{opacity:1;text-decoration:underline}
header .clock{margin-left:auto;opacity:.75;font-size:.9em}
main{padding:1rem 1.5rem 2rem;max-width:1400px}
h1{font-size:1.35rem;margin:.4rem 0 .8rem}
h2{font-size:1.05rem;margin:1.6rem 0 .5rem}
a{color:var(--accent)}
.summary{display:flex;flex-wrap:wrap;gap:.5rem 1.2rem;align-items:center;margin-bottom:.8rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;overflow-x:auto}
table{border-collapse:collapse;width:100%}
th,td{padding:.45rem .7rem;text-align:left;border-bottom:1px solid var(--line);
vertical-align:top;white-space:nowrap}
td.wrap{white-space:normal;min-width:8rem;max-width:22rem}
th{font-size:.78rem;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);
background:#fafbfd}
tr:last-child td{border-bottom:0}
.muted{color:var(--muted)}
.small{font-size:.85em}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.92em}
.badge{display:inline-block;padding:.05rem .5rem;border-radius:999px;font-size:.8rem;
font-weight:600;color:#fff;background:var(--idle)}
.s-ok,.s-succeeded{background:var(--ok)}
.s-running,.s-queued{background:var(--run)}
.s-overdue,.s-failing,.s-failed,.s-lost,.s-gone{background:var(--bad)}
.s-stuck,.s-missed,.s-differs{background:var(--warn)}
.s-up{background:var(--ok)}
.reasons{margin:.2rem 0 0;padding:0;list-style:none;color:var(--muted);font-size:.85em;
white-space:normal}
.note,.notice,.refused{padding:.6rem .9rem;border-radius:8px;margin:.6rem 0}
.note{background:#fff4e5;border:1px solid #f3c98b}
.notice{background:#e8f5ec;border:1px solid #9fd3ae}
.refused{background:#fdecec;border:1px solid #f2a9a9}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1.2rem;margin:0;
padding:.9rem 1.1rem;max-width:46rem}
dl.facts dt{color:var(--muted)}
dl.facts dd{margin:0}
form.actions{display:flex;flex-wrap:wrap;gap:.6rem;align-items:center;padding:.8rem 1.1rem}
form.actions input{padding:.35rem .5rem;border:1px solid #c3cad6;border-radius:6px;
min-width:16rem;font:inherit}
button{font:inherit;padding:.35rem .9rem;border-radius:6px;border:1px solid var(--accent);
background:var(--accent);color:#fff;cursor:pointer}
button.secondary{background:#fff;color:var(--accent)}
svg.spark{display:block}
svg.spark .d{fill:none;stroke:var(--run);stroke-width:1.5}
svg.spark .last{fill:var(--run)}
svg.spark .limit{stroke:var(--bad);stroke-width:1;stroke-dasharray:3 2}
.empty{padding:1rem 1.1rem;color:var(--muted)}
footer{padding:0 1.5rem 1.5rem;color:var(--muted);font-size:.85em}
"""

# Reload every few seconds, unless the reader is typing a token; drop a shown notice from
# the address so a reload does not show it again.
_SCRIPT = """
var u=new URL(location.href);
if(u.searchParams.has("done")){u.searchParams.delete("done");history.replaceState(null,"",u);}
setInterval(function(){
var a=document.activeElement,t=document.querySelector("input[type=password]");
if(!document.hidden&&!(a&&a.form)&&!(t&&t.value)){location.reload();}
},REFRESH_MS);
""".replace("REFRESH_MS", str(REFRESH_S * 1000))


def _digest(source: str) -> str:
    return base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()


CSP = (
    "default-src 'none'; "
    f"style-src 'sha256-{_digest(_STYLE)}'; "
    f"script-src 'sha256-{_digest(_SCRIPT)}'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""The pages' Content-Security-Policy: the inline stylesheet and script by their hash,
nothing from another host, no framing, forms post only here."""

_RUN_STATES = {"succeeded", "failed", "lost", "running", "queued", "skipped", "missed"}


def job_path(job: str, action: str = "") -> str:
    """The dashboard's address of ``job`` (its name may hold ``/``, ``?`` or ``#``)."""
    segment = quote(job, safe="")
    if segment in (".", ".."):
        # A browser resolves a "." or ".." path segment away; encoded, it is the name.
        segment = segment.replace(".", "%2E")
    return f"/jobs/{segment}" + (f"/{action}" if action else "")


# -- small pieces ------------------------------------------------------------------------
def _badge(word: str, kind: str | None = None) -> Html:
    return el("span", word, class_=f"badge s-{kind or word}")


def _when(moment_us: int | None, today_us: int | None = None) -> Html:
    """An instant as ``2026-12-01 07:37:12Z`` — only ``07:37:12Z`` when it falls on the
    day of ``today_us`` — exact to the µs in its tooltip."""
    if moment_us is None:
        return Html("-")
    exact = iso_utc(moment_us)
    shown = iso_utc(moment_us - moment_us % 1_000_000).replace("T", " ")
    if today_us is not None and iso_utc(today_us)[:10] == shown[:10]:
        shown = shown[11:]
    return el("time", shown, datetime=exact, title=exact)


def _relative(moment_us: int | None, now_us: int) -> Html:
    """``4m ago`` / ``in 2m``, exact in its tooltip."""
    if moment_us is None:
        return Html("-")
    seconds = (now_us - moment_us) // 1_000_000
    if seconds >= 0:
        text = "just now" if seconds == 0 else f"{format_duration(seconds * 1_000_000)} ago"
    else:
        text = f"in {format_duration(-seconds * 1_000_000)}"
    exact = iso_utc(moment_us)
    return el("time", text, datetime=exact, title=exact)


def _duration(micros: int | None) -> str:
    if micros is None:
        return "-"
    if micros >= 60_000_000:
        micros -= micros % 1_000_000  # 1h2m3s, not 1h2m3.456789s
    return format_duration(micros)


def sparkline(
    durations_us: Sequence[int], lock_at_most_us: int | None, *, width: int = 120
) -> Html:
    """An inline SVG of the recent successful durations (oldest first), on a scale that
    reaches ``lock_at_most``, drawn as a dashed line: how close runs come to their lease."""
    if not durations_us:
        return Html('<span class="muted">-</span>')
    height, pad = 28, 3
    top = max(max(durations_us), lock_at_most_us or 0) or 1
    span_x = width - 2 * pad

    def y(value: int) -> float:
        return round(height - pad - value / top * (height - 2 * pad), 1)

    steps = max(1, len(durations_us) - 1)
    points = [
        (round(pad + index * span_x / steps, 1), y(value))
        for index, value in enumerate(durations_us)
    ]
    last_x, last_y = points[-1]
    parts = [el("title", _spark_title(durations_us, lock_at_most_us))]
    if lock_at_most_us:
        line_y = y(lock_at_most_us)
        parts.append(el("line", class_="limit", x1=pad, x2=width - pad, y1=line_y, y2=line_y))
    if len(points) > 1:
        parts.append(el("polyline", class_="d", points=" ".join(f"{px},{py}" for px, py in points)))
    parts.append(el("circle", class_="last", cx=last_x, cy=last_y, r=2))
    return el(
        "svg",
        *parts,
        class_="spark",
        width=width,
        height=height,
        viewBox=f"0 0 {width} {height}",
        role="img",
        aria_label="recent successful run durations",
    )


def _spark_title(durations_us: Sequence[int], lock_at_most_us: int | None) -> str:
    text = (
        f"{len(durations_us)} successful run(s): last {_duration(durations_us[-1])}, "
        f"longest {_duration(max(durations_us))}"
    )
    if lock_at_most_us:
        text += f"; lock_at_most {_duration(lock_at_most_us)} (dashed)"
    return text


def _table(header: Sequence[str], rows: Sequence[Html], empty: str) -> Html:
    if not rows:
        return el("div", empty, class_="card empty")
    head = el("thead", el("tr", [el("th", name) for name in header]))
    return el("div", el("table", head, el("tbody", rows)), class_="card")


def _page(
    title: str,
    namespace: str,
    now_us: int | None,
    body: Html,
    *,
    current: str = "",
    refresh: bool = True,
) -> str:
    nav = el(
        "nav",
        [
            el("a", label, href=href, aria_current="page" if href == current else None)
            for label, href in (("Jobs", "/"), ("Leases", "/leases"), ("JSON", "/api/status"))
        ],
    )
    header = el(
        "header",
        el("a", "fleetcron", href="/", class_="brand"),
        el("span", "namespace ", el("b", namespace)),
        nav,
        el("span", "store time ", _when(now_us), class_="clock"),
    )
    footer = el(
        "footer",
        f"Refreshes every {REFRESH_S} s. " if refresh else "",
        "Times are the store's clock, in UTC.",
    )
    document = join(
        Html("<!doctype html>"),
        el(
            "html",
            el(
                "head",
                el("meta", charset="utf-8"),
                el("meta", name="viewport", content="width=device-width, initial-scale=1"),
                el("title", f"{title} · fleetcron · {namespace}"),
                el("style", Html(_STYLE)),
            ),
            el(
                "body",
                header,
                el("main", body),
                footer,
                el("script", Html(_SCRIPT)) if refresh else None,
            ),
            lang="en",
        ),
    )
    return str(document)


# -- the pages ---------------------------------------------------------------------------
def _job_row(health: JobHealth, now_us: int) -> Html:
    last = health.last_run
    running = health.running
    said = [reason for reason in health.reasons if reason != health.state]  # not "paused"
    reasons = el("ul", [el("li", reason) for reason in said], class_="reasons") if said else None
    return el(
        "tr",
        el("td", el("a", health.job, href=job_path(health.job))),
        el("td", _badge(health.state), reasons, class_="wrap", data_state=health.state),
        el("td", health.schedule, class_="small wrap"),
        el(
            "td",
            _relative(health.next_slot_us, now_us),
            el("div", _when(health.next_slot_us, now_us), class_="muted small"),
        ),
        el(
            "td",
            "-" if last is None else join(_when(last.slot_us, now_us), " ", _badge(last.state)),
        ),
        el("td", _relative(health.last_success_us, now_us)),
        el(
            "td",
            "-"
            if running is None
            else join(
                el("span", display_holder(running.holder), class_="mono"),
                el("div", f"for {_duration(health.lease_age_us)}", class_="muted small"),
            ),
        ),
        el("td", sparkline(health.durations_us, health.lock_at_most_us)),
        data_job=health.job,
    )


def _replica_row(replica: ReplicaRecord, differs: bool) -> Html:
    state = _badge("up") if replica.alive else _badge("gone")
    return el(
        "tr",
        el("td", replica.replica_id, class_="mono"),
        el("td", replica.mode),
        el("td", state, " ", _badge("differs") if differs else None),
        el("td", replica.version),
        el("td", _when(replica.started_us)),
        el("td", _relative(replica.last_seen_us, replica.now_us)),
        el(
            "td",
            replica.jobs_fingerprint[:FINGERPRINT_SHOWN],
            class_="mono",
            title=replica.jobs_fingerprint,
        ),
        data_replica=replica.replica_id,
    )


def _queue_row(queue: QueueStats) -> Html:
    waiting = "-" if queue.oldest_us is None else _duration(queue.oldest_age_us)
    return el(
        "tr",
        el("td", queue.queue, class_="mono"),
        el("td", str(queue.ready)),
        el("td", str(queue.scheduled)),
        el("td", str(queue.claimed)),
        el("td", str(queue.done)),
        el("td", _badge(f"{queue.dead} dead", "failing") if queue.dead else "0"),
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
        _relative(leader.acquired_us, status.now_us),
        ")",
    )


def index_page(status: FleetStatus) -> str:
    """``/``: every job, worst first; the leader; the replicas."""
    counts: dict[str, int] = {}
    for health in status.jobs:
        counts[health.state] = counts.get(health.state, 0) + 1
    summary = el(
        "div",
        el("span", f"{len(status.jobs)} job(s)"),
        [el("span", _badge(f"{count} {state}", state)) for state, count in counts.items()],
        _leader(status),
        class_="summary",
    )
    header = ("Job", "State", "Schedule", "Next slot", "Last run", "Last success", "Holder",
              "Durations")  # fmt: skip
    jobs = _table(
        header,
        [_job_row(health, status.now_us) for health in status.jobs],
        f"No jobs in namespace {status.namespace!r}: jobs register when a replica runs.",
    )
    differing = status.differing_replicas
    replicas = _table(
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
                _table(
                    ("Queue", "Ready", "Scheduled", "Claimed", "Done", "Dead", "Oldest waiting"),
                    [_queue_row(queue) for queue in status.queues],
                    "",
                ),
            ]
            if status.queues
            else []
        ),
    )
    return _page("Jobs", status.namespace, status.now_us, body, current="/")


def _at(moment_us: int | None, now_us: int) -> Html:
    """``2026-12-01 07:37:12Z (4m ago)``."""
    if moment_us is None:
        return Html("-")
    return join(_when(moment_us), " ", el("span", "(", _relative(moment_us, now_us), ")",
                                          class_="muted"))  # fmt: skip


def _facts(health: JobHealth, now_us: int) -> Html:
    running = health.running
    facts: list[tuple[str, object]] = [
        ("Schedule", health.schedule),
        ("Next slot", _at(health.next_slot_us, now_us)),
        ("Expected slot", _when(health.expected_slot_us)),
        ("Grace", _duration(health.grace_us)),
        ("Last success", _at(health.last_success_us, now_us)),
        ("Last failure", _at(health.last_failure_us, now_us)),
        (
            "Running",
            "-"
            if running is None
            else join(
                el("span", display_holder(running.holder), class_="mono"),
                f" for {_duration(health.lease_age_us)} (fence {running.fence})",
            ),
        ),
        ("lock_at_most", _duration(health.lock_at_most_us)),
        ("Stuck after", _duration(health.stuck_after_us)),
        ("p95 duration", _duration(health.p95_duration_us)),
        ("Durations", sparkline(health.durations_us, health.lock_at_most_us, width=240)),
    ]
    return el(
        "dl",
        [join(el("dt", name), el("dd", value)) for name, value in facts],
        class_="facts card",
    )


def _actions(health: JobHealth) -> Html:
    """One form, the token typed in it, a button per action: nothing is stored in the
    browser, so a page of another site cannot make it act (docs/operations.md)."""
    toggle = "resume" if health.paused else "pause"
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
        method="post",
        action=job_path(health.job, "trigger"),
        class_="actions card",
    )


def _ledger_row(run: RunRecord) -> Html:
    return el(
        "tr",
        el("td", _when(run.slot_us)),
        el("td", _badge(run.state, run.state if run.state in _RUN_STATES else "other")),
        el("td", display_holder(run.holder) or "-", class_="mono"),
        el("td", run.attempt),
        el("td", run.fence or "-"),
        el("td", run.trigger),
        el("td", _when(run.started_us)),
        el("td", _duration(run_duration_us(run))),
        el("td", "-" if run.exit_code is None else run.exit_code),
        el("td", run.error or "", class_="wrap small"),
        data_state=run.state,
    )


NOTICES = {
    "queued": "Queued a run; a replica claims it within a few seconds.",
    "exists": "That slot already has a ledger row: nothing was queued.",
    "paused": "Paused on every replica.",
    "resumed": "Resumed on every replica.",
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
        el("h1", health.job, " ", _badge(health.state)),
        el("div", NOTICES[notice], class_="notice", role="status") if notice in NOTICES else None,
        el("div", refused, class_="refused", role="alert") if refused else None,
        el("ul", [el("li", reason) for reason in health.reasons], class_="reasons")
        if health.reasons
        else None,
        _facts(health, status.now_us),
        join(el("h2", "Actions"), _actions(health)) if actions else None,
        el("h2", "Ledger"),
        _table(
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
    return _page(health.job, status.namespace, status.now_us, body, refresh=refused is None)


def _lease_row(lease: LeaseRecord) -> Html:
    held = lease.held
    return el(
        "tr",
        el("td", lease.name, class_="mono"),
        el("td", _badge("held", "running") if held else _badge("free", "other")),
        el("td", lease.holder_display if held else "-", class_="mono"),
        el("td", lease.fence),
        el("td", _duration(lease.now_us - lease.acquired_us) if held else "-"),
        el("td", _duration(lease.expires_us - lease.now_us) if held else "-"),
        el("td", _when(lease.acquired_us)),
        data_lease=lease.name,
    )


def leases_page(status: FleetStatus) -> str:
    """``/leases``: every lease row of the namespace, held or free (but the monitor's
    alert markers, which :func:`~fleetcron.status.read_status` keeps apart)."""
    body = join(
        el("h1", "Leases"),
        el("p", _leader(status), class_="summary"),
        _table(
            ("Name", "State", "Holder", "Fence", "Held for", "Expires in", "Acquired"),
            [_lease_row(lease) for lease in status.leases],
            "No leases in this namespace.",
        ),
    )
    return _page("Leases", status.namespace, status.now_us, body, current="/leases")


def error_page(namespace: str, now_us: int | None, title: str, message: str) -> str:
    """A page that says what is wrong (an unknown job, the store unreachable)."""
    body = join(el("h1", title), el("p", message), el("p", el("a", "← all jobs", href="/")))
    return _page(title, namespace, now_us, body, refresh=False)
