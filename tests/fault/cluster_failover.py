"""Redis Cluster failover: the master serving the contenders' lease is SIGKILLed and its
replica promoted by the cluster.

The scenario runs on a :class:`~redis_cluster.RedisCluster` of its own (``Scenario.needs ==
"cluster"``: three masters, three replicas, ``cluster-node-timeout`` 2 s): three lock
contenders (renewing their lease) and two ``fleetcron run`` replicas (two jobs every
second) work against its ``redis+cluster://`` URL; the master of the lease's hash slot is
SIGKILLed; the cluster promotes its replica; the clients follow the new slot map by
themselves.

Redis replicates asynchronously, so what the dead master acknowledged and its replica had
not received is lost (docs/ha.md): a lease granted or renewed just before can be granted
again (``overlap``, allowed and counted; the fence-checking resource rejects the older
holder) and a slot claimed or finished just before can lose its ledger row
(``slot_accounting``, allowed and counted). Fences must still increase — the checker's
``fence_order`` is not relaxed — and the fleet must resume: the scenario fails if no grant
and no run follow the failover. The figures say how long the fleet waited.
"""

from __future__ import annotations

import time

from fault.load import (
    JOBS,
    LEASE,
    LOST_OK,
    SECOND,
    events_of,
    expect_every_slot,
    mono,
    start_load,
)
from fault.runner import Run, Scenario, ScenarioFailed, wait_until
from fleetcron.stores.redis.keys import lease_key
from redis_cluster import RedisCluster

__all__ = ["CLUSTER_SCENARIOS"]


def _cluster(run: Run) -> RedisCluster:
    if not isinstance(run.server, RedisCluster):
        raise ScenarioFailed(f"{run.scenario} needs a RedisCluster, not {run.server!r}")
    return run.server


def cluster_master_sigkill(run: Run) -> None:
    """SIGKILL of the master serving the lease: the fleet resumes on the promoted replica,
    fences keep increasing; what the failover lost is allowed and counted."""
    cluster = _cluster(run)
    start_load(run, ttl_ms=3000, hold_ms=1500, keepalive=True)
    victim = cluster.master_of(lease_key(run.namespace, LEASE))
    grants_before = len(events_of(run.histories(), "acquire_ok"))
    cluster.nodes.kill(victim)
    killed = mono()
    run.fault(f"SIGKILL the master serving the lease ({victim})")
    started = time.monotonic()
    wait_until(
        lambda: cluster.role(victim) is None and len(cluster.masters()) == 3,
        timeout=60,
        what="the cluster to promote the dead master's replica",
    )
    run.fault("the cluster promoted a replica")
    run.figures["promotion_s"] = round(time.monotonic() - started, 2)

    def resumed() -> bool:
        events = run.histories()
        grants = [e for e in events_of(events, "acquire_ok") if e.mono_us > killed]
        runs = {
            job: [e for e in events_of(events, "run_start", job) if e.mono_us > killed]
            for job in JOBS
        }
        return len(grants) >= 2 and all(len(started) >= 2 for started in runs.values())

    wait_until(resumed, timeout=60, what="grants and runs of each job after the failover")
    events = run.histories()
    first = min(e.mono_us for e in events_of(events, "acquire_ok") if e.mono_us > killed)
    run.figures["kill_to_grant_s"] = round((first - killed) / SECOND, 2)
    run.figures["grants_before_kill"] = grants_before
    run.figures["calls_failed"] = sum(
        1 for e in events if e.event.endswith("_error") and e.mono_us > killed
    )
    run.stop_all()
    expect_every_slot(run)


CLUSTER_SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "redis_cluster_failover",
        "Redis Cluster: the lease's master SIGKILLed, its replica promoted",
        cluster_master_sigkill,
        backends=("redis",),
        needs="cluster",
        allow=frozenset({"overlap", "slot_accounting"}),
        ok_states=LOST_OK,
    ),
)
"""The Redis Cluster scenarios, registered in :data:`fault.scenarios.SCENARIOS`."""
