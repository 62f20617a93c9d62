"""One leader-mode replica with a short leader lease, for ``test_run_replicas``.

``fleetcron run`` has no option for the leader lease's length (it is always 15 s), so the
fail-over test runs the scheduler through the Python API instead. Usage::

    python leaderreplica.py BACKEND_URL NAMESPACE JOBS.toml LEADER_TTL_S

It runs until SIGTERM/SIGINT, logs like ``fleetcron run`` (stderr, INFO) and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from fleetcron.jobsfile import load_jobs_file
from fleetcron.scheduler import AsyncScheduler, SchedulerOptions
from fleetcron.stores import open_async_store, parse_store_url


async def main(url: str, namespace: str, jobs_path: str, ttl_s: float) -> None:
    jobs = load_jobs_file(jobs_path)
    store = await open_async_store(parse_store_url(url))
    try:
        options = SchedulerOptions(
            namespace=namespace,
            mode="leader",
            leader_ttl_us=round(ttl_s * 1e6),
            shutdown_grace_s=10.0,
            backend_url=url,
        )
        scheduler = AsyncScheduler(store, jobs.jobs, options)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, scheduler.stop)
        await scheduler.run()
    finally:
        await store.close()


if __name__ == "__main__":
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s fleetcron: %(message)s"))
    logger = logging.getLogger("fleetcron")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    backend, ns, path, ttl = sys.argv[1:5]
    asyncio.run(main(backend, ns, path, float(ttl)))
