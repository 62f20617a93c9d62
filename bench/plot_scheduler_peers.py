"""A plot of bench/scheduler_peers.py results: for each subject and scenario, the slots of
the window that ran once, the extra executions (doubled) and the slots that never ran.

    .venv/bin/python bench/plot_scheduler_peers.py out.png result.json [result.json ...]

Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def scenario(result: dict[str, Any]) -> str:
    a = result["meta"]["args"]
    return f"{a['jobs']:,} jobs × {a['replicas']} replicas, every 1 s, {a['seconds']} s"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    results = [json.loads(Path(path).read_text()) for path in argv[1:]]
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        subjects = result["subjects"]
        names = [s["subject"] for s in subjects]
        expected = max(s["slots_expected"] for s in subjects)
        ran = [s["slots_ran"] / expected * 100 for s in subjects]
        doubled = [s["doubled"] / expected * 100 for s in subjects]
        missed = [s["missed"] / expected * 100 for s in subjects]
        x = range(len(names))
        ax.bar(x, ran, color="#2a7", label="ran (% of slots)")
        ax.bar(x, missed, bottom=ran, color="#bbb", label="missed")
        ax.bar(
            x,
            doubled,
            bottom=[r + m for r, m in zip(ran, missed, strict=True)],
            color="#d33",
            label="extra executions (doubled)",
        )
        for i, s in enumerate(subjects):
            p99 = s.get("lag_ms_p99")
            note = "no run" if p99 is None else f"p99 lag\n{p99 / 1000:,.2f} s"
            ax.text(
                i,
                2,
                note,
                ha="center",
                va="bottom",
                fontsize=8,
                color="white" if ran[i] > 10 else "black",
            )
        ax.set_xticks(list(x), names)
        ax.set_ylabel("% of the window's slots")
        ax.set_title(scenario(result), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(loc="upper right", fontsize=8)
    fig.suptitle("Scheduler side by side, one PostgreSQL (2 vCPU VM): lower red and grey is better")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
