"""``python -m tests.fault``: run fault scenarios outside pytest and print the verdicts.

python -m tests.fault --list
python -m tests.fault --scenario holder_sigkill --backend postgres
python -m tests.fault --all --results docs/reliability-results.json   # the full suite
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[2] / "src"),
]

from fault.runner import BACKENDS, RunResult, Scenario, run_scenario  # noqa: E402
from fault.scenarios import SCENARIOS, by_name  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.fault", description=__doc__)
    parser.add_argument("--list", action="store_true", help="name the scenarios and stop")
    parser.add_argument("--scenario", action="append", default=[], help="run this scenario")
    parser.add_argument("--all", action="store_true", help="run every scenario")
    parser.add_argument("--fast", action="store_true", help="run the fast subset (CI's)")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="only on this backend")
    parser.add_argument("--results", type=Path, help="write the verdicts as JSON here")
    parser.add_argument("--keep", type=Path, help="keep each run's histories under this directory")
    return parser


def _scenario(name: str) -> Scenario:
    try:
        return by_name(name)
    except KeyError as exc:
        _parser().error(str(exc.args[0]))


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scenarios; exit 1 when any found an anomaly or failed."""
    args = _parser().parse_args(argv)
    if args.list:
        for scenario in SCENARIOS:
            fast = " (fast)" if scenario.fast else ""
            sys.stdout.write(
                f"{scenario.name:28} {','.join(scenario.backends):28} {scenario.summary}{fast}\n"
            )
        return 0
    chosen = (
        list(SCENARIOS)
        if args.all
        else [s for s in SCENARIOS if s.fast]
        if args.fast
        else [_scenario(name) for name in args.scenario]
    )
    if not chosen:
        _parser().error("name a --scenario, or --fast, --all or --list")
    results: list[RunResult] = []
    for scenario in chosen:
        for backend in scenario.backends:
            if args.backend and backend not in args.backend:
                continue
            if args.fast and not scenario.fast_on(backend):
                continue
            keep = args.keep / f"{scenario.name}-{backend}" if args.keep else None
            result = run_scenario(scenario, backend, keep=keep)
            results.append(result)
            verdict = "ok" if result.ok else "FAILED"
            sys.stdout.write(
                f"{scenario.name:28} {backend:9} {verdict:6} {result.seconds:6.1f}s "
                f"faults={result.faults} events={result.events} slots={result.slots}"
                + (f" stale_rejected={result.report.rejected}" if result.report else "")
                + "".join(f" allowed:{kind}={n}" for kind, n in sorted(result.allowed().items()))
                + "".join(f" {name}={value}" for name, value in result.figures.items())
                + "\n"
            )
            if not result.ok:
                if result.error:
                    sys.stdout.write(f"    error: {result.error}\n")
                if result.report is not None:
                    for anomaly in result.report.anomalies:
                        sys.stdout.write(f"    {anomaly}\n")
            sys.stdout.flush()
    if args.results:
        args.results.write_text(json.dumps([r.as_json() for r in results], indent=2) + "\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
