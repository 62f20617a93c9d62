"""The tables of docs/reliability.md from a results file of ``python -m tests.fault --all
--results FILE``: ``python -m tests.fault.report FILE`` prints them as Markdown."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

NAMES = {
    "sqlite": "SQLite",
    "postgres": "PostgreSQL",
    "mysql": "MariaDB",
    "redis": "Redis",
    "etcd": "etcd",
}
BACKENDS = tuple(NAMES)
"""The columns, in order (the backends of ``fault.runner.BACKENDS``)."""


def _cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "–"
    if result["error"]:
        return "**failed**"
    if result["anomalies"]:
        return f"**{len(result['anomalies'])} anomalies**"
    allowed = result.get("allowed") or {}
    return "ok" + (f" ({', '.join(sorted(allowed))} allowed)" if allowed else "")


def tables(results: list[dict[str, Any]], summaries: dict[str, str]) -> str:
    """The per-backend totals and the per-scenario verdicts."""
    by_backend: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_case: dict[tuple[str, str], dict[str, Any]] = {}
    order: list[str] = []
    for result in results:
        by_backend[result["backend"]].append(result)
        by_case[(result["scenario"], result["backend"])] = result
        if result["scenario"] not in order:
            order.append(result["scenario"])
    lines = [
        "| Backend | scenarios | faults injected | events checked | grants | protected "
        "writes (rejected as stale) | slots checked | anomalies |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend in BACKENDS:
        rows = by_backend.get(backend, [])
        if not rows:
            continue
        anomalies = sum(len(r["anomalies"]) for r in rows) + sum(1 for r in rows if r["error"])
        lines.append(
            f"| {NAMES[backend]} | {len(rows)} | {sum(r['faults'] for r in rows):,} | "
            f"{sum(r['events'] for r in rows):,} | {sum(r.get('grants', 0) for r in rows):,} | "
            f"{sum(r.get('writes', 0) for r in rows):,} "
            f"({sum(r.get('rejected', 0) for r in rows):,}) | "
            f"{sum(r['slots'] for r in rows):,} | {anomalies} |"
        )
    lines += ["", "| Scenario | " + " | ".join(NAMES[b] for b in BACKENDS) + " |"]
    lines.append("|---|" + "---|" * len(BACKENDS))
    for scenario in order:
        summary = summaries.get(scenario, "")
        cells = " | ".join(_cell(by_case.get((scenario, backend))) for backend in BACKENDS)
        lines.append(f"| {scenario} — {summary} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results = json.loads(Path(args[0]).read_text())
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    from fault.scenarios import SCENARIOS

    summaries = {scenario.name: scenario.summary for scenario in SCENARIOS}
    sys.stdout.write(tables(results, summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
