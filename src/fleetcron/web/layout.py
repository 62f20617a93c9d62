"""The dashboard's building blocks: the page around every view (one inline stylesheet and
one short script, allowed by their hash: the page loads nothing from anywhere else), and
the small pieces the views share — badges, instants, durations, tables, the sparkline.
Times are the store's clock, shown in UTC; everything from the store is escaped
(:mod:`fleetcron.web.markup`).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from urllib.parse import quote

from fleetcron.durations import format_duration
from fleetcron.schedules import iso_utc
from fleetcron.web.markup import Html, el, join

__all__ = [
    "CSP",
    "REFRESH_S",
    "badge",
    "document",
    "duration",
    "job_path",
    "relative",
    "sparkline",
    "table",
    "when",
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
.summary a.filter{text-decoration:none}
.summary a.filter[aria-current] .badge{box-shadow:0 0 0 2px var(--bg),0 0 0 4px var(--fg)}
.pager{display:flex;flex-wrap:wrap;gap:.4rem 1rem;align-items:baseline;margin:.6rem 0}
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
.s-stuck,.s-missed,.s-cancelled,.s-differs{background:var(--warn)}
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
button.danger{background:#fff;color:var(--bad);border-color:var(--bad)}
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


def job_path(job: str, action: str = "") -> str:
    """The dashboard's address of ``job`` (its name may hold ``/``, ``?`` or ``#``)."""
    segment = quote(job, safe="")
    if segment in (".", ".."):
        # A browser resolves a "." or ".." path segment away; encoded, it is the name.
        segment = segment.replace(".", "%2E")
    return f"/jobs/{segment}" + (f"/{action}" if action else "")


# -- small pieces ------------------------------------------------------------------------
def badge(word: str, kind: str | None = None) -> Html:
    """``word`` in a pill coloured by ``kind`` (default: the word itself, a state)."""
    return el("span", word, class_=f"badge s-{kind or word}")


def when(moment_us: int | None, today_us: int | None = None) -> Html:
    """An instant as ``2026-12-01 07:37:12Z`` — only ``07:37:12Z`` when it falls on the
    day of ``today_us`` — exact to the µs in its tooltip."""
    if moment_us is None:
        return Html("-")
    exact = iso_utc(moment_us)
    shown = iso_utc(moment_us - moment_us % 1_000_000).replace("T", " ")
    if today_us is not None and iso_utc(today_us)[:10] == shown[:10]:
        shown = shown[11:]
    return el("time", shown, datetime=exact, title=exact)


def relative(moment_us: int | None, now_us: int) -> Html:
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


def duration(micros: int | None) -> str:
    """``2.5s``, ``1h2m3s`` (whole seconds from a minute on), ``-`` for none."""
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
        f"{len(durations_us)} successful run(s): last {duration(durations_us[-1])}, "
        f"longest {duration(max(durations_us))}"
    )
    if lock_at_most_us:
        text += f"; lock_at_most {duration(lock_at_most_us)} (dashed)"
    return text


def table(header: Sequence[str], rows: Sequence[Html], empty: str) -> Html:
    """A card holding a table of ``rows`` under ``header``; ``empty`` when there is none."""
    if not rows:
        return el("div", empty, class_="card empty")
    head = el("thead", el("tr", [el("th", name) for name in header]))
    return el("div", el("table", head, el("tbody", rows)), class_="card")


def document(
    title: str,
    namespace: str,
    now_us: int | None,
    body: Html,
    *,
    current: str = "",
    refresh: bool = True,
) -> str:
    """The whole page around ``body``: the header (``current``: the address of the view in
    the navigation), the footer and, unless ``refresh`` is false, the reloading script."""
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
        el("span", "store time ", when(now_us), class_="clock"),
    )
    footer = el(
        "footer",
        f"Refreshes every {REFRESH_S} s. " if refresh else "",
        "Times are the store's clock, in UTC.",
    )
    html = join(
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
    return str(html)
