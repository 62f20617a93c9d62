"""Plots of bench/scheduler.py results: fire-lag distribution per run, and runs started per
second of the store's clock.

    .venv/bin/python bench/plot_scheduler.py out.png result.json [result.json ...]
    .venv/bin/python bench/plot_scheduler.py out.png "before=a.json" "after=b.json"

A ``NAME=`` prefix puts NAME before the run's description in the legend.

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


def label(result: dict[str, Any]) -> str:
    a = result["meta"]["args"]
    jitter = "" if a.get("jitter", "0s") == "0s" else f", jitter {a['jitter']}"
    return f"{a['jobs']:,} jobs × {a['replicas']}, every {a['every']}{jitter}"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    fig, (cdf, rate) = plt.subplots(1, 2, figsize=(12, 4.6))
    for arg in argv[1:]:
        name, _, path = arg.rpartition("=")
        result = json.loads(Path(path).read_text())
        legend = f"{name}: {label(result)}" if name else label(result)
        s = result["summary"]
        lags = s.get("lag_ms_percentiles") or []
        if lags:
            cdf.plot([v / 1000 for v in lags], range(len(lags)), label=legend)
        per_s = {int(k): v for k, v in s.get("runs_started_per_s", {}).items()}
        if per_s:
            xs = list(range(min(per_s), max(per_s) + 1))
            rate.plot(xs, [per_s.get(x, 0) for x in xs], label=legend, linewidth=1)
    cdf.set_xscale("symlog", linthresh=0.1)
    ticks = [0, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50]
    cdf.set_xticks(ticks, [f"{t:g}" for t in ticks])
    cdf.set_xlim(0, 60)
    cdf.set_xlabel("fire lag: run start − (slot + jitter), s (store clock)")
    cdf.set_ylabel("percentile of runs in the window")
    cdf.axvline(1.0, color="#999999", linestyle=":", linewidth=1)
    cdf.set_title("Fire lag")
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize=8, loc="lower right")
    rate.set_xlabel("second of the store's clock from the measured window's start")
    rate.set_ylabel("runs started, whole fleet")
    rate.set_title("Runs started per second")
    rate.grid(alpha=0.3)
    rate.legend(fontsize=8, loc="upper right")
    fig.suptitle("fleetcron scheduler on PostgreSQL, replicas as processes on 2 vCPUs")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
