"""Bar plot of the lock-cycle p50 per subject, grouped by backend, from bench/results/locks.json.

    .venv/bin/python bench/plot_locks.py [results.json] [out.png]

Needs matplotlib (``.venv/bin/pip install matplotlib``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("sqlite", "postgres", "mysql", "redis")
KIND_ORDER = {"fleetcron": 0, "floor": 1, "peer": 2, "ref": 3}
COLOURS = {"fleetcron": "#d62728", "floor": "#7f7f7f", "peer": "#1f77b4", "ref": "#c7c7c7"}


def short(row: dict[str, Any]) -> str:
    if row["kind"] == "fleetcron":
        return "fleetcron"
    if row["kind"] == "floor":
        return "floor"
    if row["kind"] == "ref":
        return "1 RT ref"
    return str(row["key"])


def plot(results: dict[str, Any], out: Path) -> None:
    rows = [r for r in results["subjects"] if "p50_us" in r]
    backends = [b for b in BACKENDS if any(r["backend"] == b for r in rows)]
    fig, axes = plt.subplots(
        1,
        len(backends),
        figsize=(3.2 * len(backends) + 1, 4.6),
        gridspec_kw={"width_ratios": [sum(r["backend"] == b for r in rows) for b in backends]},
    )
    if len(backends) == 1:
        axes = [axes]
    for ax, backend in zip(axes, backends, strict=True):
        group = sorted(
            (r for r in rows if r["backend"] == backend), key=lambda r: KIND_ORDER[r["kind"]]
        )
        xs = range(len(group))
        p50 = [r["p50_us"] for r in group]
        bars = ax.bar(xs, p50, color=[COLOURS[r["kind"]] for r in group])
        for bar, value in zip(bars, p50, strict=True):
            ax.annotate(
                f"{value:,.0f}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_xticks(list(xs), [short(r) for r in group], rotation=40, ha="right", fontsize=8)
        ax.set_title(backend, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_ylabel("p50 µs per acquire + release (lower is better)")
    started = results["meta"]["started_utc"]
    fig.suptitle(f"Uncontended lock cycle, p50 (127.0.0.1, 2 vCPU VM, {started})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv: list[str]) -> int:
    source = Path(argv[1]) if len(argv) > 1 else ROOT / "bench" / "results" / "locks.json"
    out = Path(argv[2]) if len(argv) > 2 else ROOT / "docs" / "img" / "locks_p50.png"
    plot(json.loads(source.read_text()), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
