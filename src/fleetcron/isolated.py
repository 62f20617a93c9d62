"""A ``call`` job with ``isolate = "process"``: the child process that runs it.

The scheduler starts ``python -m fleetcron.isolated`` like a command — in a process group
of its own, with the run's ``FLEETCRON_*`` environment — so it is stopped like a command:
SIGTERM a grace before the lease's deadline (here it cancels the context and raises
:class:`~fleetcron.errors.RunCancelled` in the job), SIGKILL at the deadline — by the
replica, or by its reaper (:mod:`fleetcron.reaper`) when the replica is frozen or dead.

:func:`child_command` builds the command line and the payload the parent passes in
``FLEETCRON_ISOLATED``; :func:`main` is the child's side. The child writes a failure's
one-line summary to the file descriptor the payload names, and exits 0 on success.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import runpy
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from fleetcron.context import RunContext
from fleetcron.errors import RunCancelled
from fleetcron.jobspec import CallTarget

__all__ = ["PAYLOAD_ENV", "child_command", "child_payload", "main"]

PAYLOAD_ENV = "FLEETCRON_ISOLATED"
_SUMMARY_LIMIT = 4096


def _module_root(module: ModuleType) -> str | None:
    """The directory to put on ``sys.path`` so the child imports ``module`` by its name
    (a module found beside a jobs file is not on the parent's path any more)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    root = Path(file).resolve().parent
    levels = module.__name__.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    for _ in range(levels):
        root = root.parent
    return str(root)


def child_payload(target: CallTarget, ctx: RunContext, result_fd: int) -> str:
    """The JSON the child needs to find ``target``'s function, rebuild ``ctx`` (the rest
    of it is in the ``FLEETCRON_*`` environment) and report its end."""
    module_name = target.reference.partition(":")[0]
    module = sys.modules.get(module_name)
    main = None
    if module_name == "__main__" and module is not None:
        main = getattr(module, "__file__", None)
    return json.dumps(
        {
            "reference": target.reference,
            "root": _module_root(module) if module is not None and main is None else None,
            "main": main,
            "path": [entry for entry in sys.path if entry],
            "result_fd": result_fd,
            "slot_us": ctx.slot_us,
            "trigger": ctx.trigger,
        }
    )


def child_command() -> list[str]:
    """The argv of the child process. Not ``-m fleetcron.isolated``: importing the package
    imports this module first, and runpy then warns on the child's stderr — the first line
    of every isolated run's output."""
    return [sys.executable, "-c", "from fleetcron.isolated import main; raise SystemExit(main())"]


def _load(payload: dict[str, Any]) -> Callable[..., object]:
    module_name, _, attribute = str(payload["reference"]).partition(":")
    sys.path[:0] = [p for p in payload["path"] if p not in sys.path]
    if payload.get("root"):
        sys.path.insert(0, payload["root"])
    namespace: Any
    if payload.get("main"):
        # The parent's main script, imported under another name so its
        # ``if __name__ == "__main__":`` block does not run again (as multiprocessing does).
        namespace = runpy.run_path(payload["main"], run_name="__mp_main__")
        target: Any = namespace[attribute.split(".")[0]]
        parts = attribute.split(".")[1:]
    else:
        import importlib

        target = importlib.import_module(module_name)
        parts = attribute.split(".")
    for part in parts:
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{payload['reference']} is not callable")
    return target  # type: ignore[no-any-return]


def _context(payload: dict[str, Any]) -> RunContext:
    env = os.environ
    job = env["FLEETCRON_JOB"]
    fence = int(env["FLEETCRON_FENCE"])
    slot_us = int(payload["slot_us"])
    adapter = logging.LoggerAdapter(
        logging.getLogger(f"fleetcron.job.{job}"), {"job": job, "slot_us": slot_us, "fence": fence}
    )
    return RunContext(
        job=job,
        namespace=env.get("FLEETCRON_NAMESPACE", "default"),
        slot_us=slot_us,
        fence=fence,
        attempt=int(env.get("FLEETCRON_ATTEMPT", "1")),
        run_id=env.get("FLEETCRON_RUN_ID", ""),
        trigger=str(payload["trigger"]),
        logger=adapter,
    )


def _report(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode("utf-8", "replace")[:_SUMMARY_LIMIT])
    except OSError:
        pass


def main() -> int:
    """Run the job named by the payload once; 0 on success."""
    payload = json.loads(os.environ.pop(PAYLOAD_ENV))
    result_fd = int(payload["result_fd"])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ctx = _context(payload)

    def on_term(signum: int, _frame: FrameType | None) -> None:
        ctx.cancel("stopped by SIGTERM")
        signal.signal(signum, signal.SIG_IGN)  # once: the job gets its grace to clean up
        raise RunCancelled(f"run of {ctx.job!r} cancelled: stopped by SIGTERM", reason="SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    try:
        function = _load(payload)
        if inspect.iscoroutinefunction(function):
            asyncio.run(function(ctx))
        else:
            function(ctx)
    except RunCancelled as exc:
        _report(result_fd, f"cancelled: {exc.reason or exc}")
        return 143
    except BaseException as exc:  # the job's own failure: summarised for the ledger
        logging.getLogger("fleetcron").exception("job %s failed", ctx.job)
        _report(result_fd, f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
