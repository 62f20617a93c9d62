"""etcd member failures: the leader SIGKILLed or frozen, every member restarted in turn,
the clients' links to one member blackholed, the leader cut from its peers and a member
cut from everyone (each member in a network namespace of its own: :mod:`etcd_netns`),
quorum lost and regained — on three members of the run's own.

Each scenario runs the load of :func:`fault.load.start_load` (three contenders renewing a
lease of 3 s, two ``fleetcron run`` replicas with two jobs every second) against
``etcd://m1,m2,m3/fault`` and acts on single members through
:attr:`fault.etcd_members.EtcdMembers.cluster`. etcd commits a write only once a majority
of members has it, so unlike an asynchronous PostgreSQL standby or Redis Cluster no fault
here may lose an acknowledged write: no anomaly is allowed (no ``overlap``, no
``slot_accounting``). While a majority is up the fleet must go on; while it is not, no
lease may be granted and every run must end by its local deadline (the runner judges runs
alive after their lease); once a majority is back the fleet must resume. The figures say
how long each step took.
"""

from __future__ import annotations

import time

from etcd_netns import EtcdNetCluster
from fault.etcd_members import EtcdMembers
from fault.load import (
    JOBS,
    LOST_OK,
    SECOND,
    events_of,
    expect_every_slot,
    mono,
    start_load,
)
from fault.runner import Run, Scenario, ScenarioFailed, wait_until

__all__ = ["ETCD_SCENARIOS"]

_TTL_MS = 3000


def _members(run: Run) -> EtcdMembers:
    if not isinstance(run.server, EtcdMembers):
        raise ScenarioFailed(f"{run.scenario} needs EtcdMembers, not {run.server!r}")
    return run.server


def _resume(run: Run, since: int, figure: str) -> None:
    """Wait until the contenders are granted twice and each job runs twice after ``since``
    (monotonic µs); ``figure``: the seconds from ``since`` to the first grant."""

    def resumed() -> bool:
        events = run.histories()
        grants = [e for e in events_of(events, "acquire_ok") if e.mono_us > since]
        return len(grants) >= 2 and all(
            len([e for e in events_of(events, "run_start", job) if e.mono_us > since]) >= 2
            for job in JOBS
        )

    wait_until(resumed, timeout=60, what="grants and runs of each job after the fault")
    first = min(e.mono_us for e in events_of(run.histories(), "acquire_ok") if e.mono_us > since)
    run.figures[figure] = round((first - since) / SECOND, 2)


def _finish(run: Run, since: int) -> None:
    events = run.histories()
    run.figures["calls_failed"] = sum(
        1 for e in events if e.event.endswith("_error") and e.mono_us > since
    )
    run.stop_all()
    expect_every_slot(run)


def leader_sigkill(run: Run) -> None:
    """The leader is SIGKILLed; the two others elect one of them and the fleet goes on."""
    members = _members(run)
    start_load(run, ttl_ms=_TTL_MS, hold_ms=1500, keepalive=True)
    leader = members.cluster.leader()
    members.cluster.kill9(leader)
    killed = mono()
    run.fault(f"SIGKILL the etcd leader (member {leader})")
    elected = members.cluster.leader()
    run.figures["election_s"] = round((mono() - killed) / SECOND, 2)
    run.fault(f"member {elected} leads")
    _resume(run, killed, "kill_to_grant_s")
    members.cluster.heal()
    run.fault(f"member {leader} restarted")
    _finish(run, killed)


def leader_sigstop(run: Run) -> None:
    """The leader is SIGSTOPped for 4 s (longer than a lease): it answers nothing while the
    others elect a new leader; once resumed it finds itself a follower of a newer term."""
    members = _members(run)
    start_load(run, ttl_ms=_TTL_MS, hold_ms=1500, keepalive=True)
    leader = members.cluster.leader()
    members.cluster.pause(leader)
    paused = mono()
    run.fault(f"SIGSTOP the etcd leader (member {leader})")
    elected = members.cluster.leader()
    run.figures["election_s"] = round((mono() - paused) / SECOND, 2)
    run.fault(f"member {elected} leads")
    _resume(run, paused, "pause_to_grant_s")
    time.sleep(max(0.0, 4.0 - (mono() - paused) / SECOND))  # the fault's length
    members.cluster.heal()
    run.fault(f"member {leader} resumed")
    _finish(run, paused)


def rolling_restart(run: Run) -> None:
    """Each member in turn, the leader last, is SIGKILLed and started again on its data
    once the fleet has gone on without it — an upgrade of the cluster."""
    members = _members(run)
    cluster = members.cluster
    start_load(run, ttl_ms=_TTL_MS, hold_ms=1500, keepalive=True)
    first = mono()
    leader = cluster.leader()
    order = [index for index in range(len(cluster.members)) if index != leader] + [leader]
    for step, member in enumerate(order):
        cluster.kill9(member)
        killed = mono()
        run.fault(f"SIGKILL etcd member {member}")
        _resume(run, killed, f"kill_to_grant_s_{step}")
        cluster.heal()
        run.fault(f"member {member} restarted")
    _finish(run, first)


def member_blackholed(run: Run) -> None:
    """Every client's link to the first member of the URL — the one each client calls
    first — is blackholed (bytes accepted, nothing answered) for 8 s: each call in flight
    waits out the URL's ``timeout`` (2 s), then the client moves to the next member and the
    fleet goes on; the member itself stays in the cluster, and may be the leader."""
    members = _members(run)
    url, group = run.proxied()
    url += "?timeout=2"
    start_load(run, ttl_ms=_TTL_MS, hold_ms=1500, keepalive=True, url=url)
    first = group.proxies[0]
    first.blackhole()
    cut = mono()
    run.fault(f"blackhole every client's link to the first member ({members.cluster.url})")
    _resume(run, cut, "cut_to_grant_s")
    time.sleep(max(0.0, 8.0 - (mono() - cut) / SECOND))  # the fault's length
    first.pass_()
    run.fault("the first member's links pass again")
    _finish(run, cut)
    if not run.figures["calls_failed"]:
        raise ScenarioFailed("no contender's call waited on the blackholed member: untested")


def _net(members: EtcdMembers) -> EtcdNetCluster:
    if not isinstance(members.cluster, EtcdNetCluster):
        raise ScenarioFailed("the scenario needs members in network namespaces")
    return members.cluster


def _lead_from_first(cluster: EtcdNetCluster) -> None:
    """Make the first member of the URL — the one every client calls first — the leader."""
    leader = cluster.leader()
    if leader != 0:
        status, answer = cluster.post(
            leader,
            "/v3/maintenance/transfer-leadership",
            {"targetID": str(cluster.member_id(0))},
        )
        if status != 200:
            raise ScenarioFailed(f"etcd refused to move its leadership: {status} {answer}")
    wait_until(lambda: cluster.leader() == 0, timeout=30, what="member 0 to lead")


def leader_partitioned(run: Run) -> None:
    """The leader, the member every client calls, is cut from its two peers for 6 s
    (twice a lease) while its clients still reach it: it cannot commit, steps down once it
    misses their answers, and the two others elect a leader; the clients' calls fail or
    time out there and move on. Once mended it rejoins as a follower."""
    members = _members(run)
    cluster = _net(members)
    _lead_from_first(cluster)
    start_load(run, ttl_ms=_TTL_MS, hold_ms=1500, keepalive=True)
    cluster.cut_from_peers(0)
    cut = mono()
    run.fault("cut the leader (member 0) from its peers; its clients still reach it")
    _resume(run, cut, "cut_to_grant_s")
    time.sleep(max(0.0, 6.0 - (mono() - cut) / SECOND))  # the fault's length
    cluster.mend()
    run.fault("links mended")
    cluster.wait_healthy()
    _finish(run, cut)


def member_isolated(run: Run) -> None:
    """The member every client calls is cut from everyone — peers and clients — for 6 s:
    the clients' calls wait out the URL's timeout (30 s by default: 2 s here, given in the
    URL) and move on to another member."""
    members = _members(run)
    cluster = _net(members)
    url = members.url + "?timeout=2"
    start_load(run, ttl_ms=_TTL_MS, hold_ms=1500, keepalive=True, url=url)
    cluster.isolate(0)
    cut = mono()
    run.fault("isolate member 0 (its link down)")
    _resume(run, cut, "cut_to_grant_s")
    time.sleep(max(0.0, 6.0 - (mono() - cut) / SECOND))  # the fault's length
    cluster.mend()
    run.fault("link mended")
    cluster.wait_healthy()
    _finish(run, cut)


def quorum_lost(run: Run) -> None:
    """Two of the three members are SIGKILLed for 6 s (twice a lease): the one left cannot
    commit, so nothing is granted, claimed or recorded and every run ends by its local
    deadline; once both are back the fleet resumes."""
    members = _members(run)
    cluster = members.cluster
    start_load(run, ttl_ms=_TTL_MS, hold_ms=1500, keepalive=True)
    leader = cluster.leader()
    victims = [index for index in range(len(cluster.members)) if index != leader]
    for member in victims:
        cluster.kill9(member)
    killed = mono()
    run.fault(f"SIGKILL etcd members {victims}: no quorum")
    time.sleep(6.0)  # the fault's length
    granted = [e for e in events_of(run.histories(), "acquire_ok") if e.mono_us > killed + SECOND]
    if granted:
        raise ScenarioFailed(f"{len(granted)} grant(s) heard without a quorum: {granted[0]}")
    cluster.heal()
    healed = mono()
    run.fault("both members restarted: quorum regained")
    run.figures["outage_s"] = round((healed - killed) / SECOND, 2)
    _resume(run, healed, "heal_to_grant_s")
    _finish(run, killed)


ETCD_SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "etcd_leader_sigkill",
        "etcd: the leader SIGKILLed, another elected",
        leader_sigkill,
        backends=("etcd",),
        fast=True,
        fast_backends=("etcd",),
        ok_states=LOST_OK,
    ),
    Scenario(
        "etcd_leader_sigstop",
        "etcd: the leader SIGSTOPped past a lease",
        leader_sigstop,
        backends=("etcd",),
        ok_states=LOST_OK,
    ),
    Scenario(
        "etcd_rolling_restart",
        "etcd: every member SIGKILLed and restarted in turn",
        rolling_restart,
        backends=("etcd",),
        ok_states=LOST_OK,
    ),
    Scenario(
        "etcd_member_blackholed",
        "etcd: clients' links to one member blackholed",
        member_blackholed,
        backends=("etcd",),
        ok_states=LOST_OK,
    ),
    Scenario(
        "etcd_leader_partitioned",
        "etcd: the leader cut from its peers, its clients still reaching it",
        leader_partitioned,
        backends=("etcd",),
        needs="partition",
        fast=True,
        fast_backends=("etcd",),
        ok_states=LOST_OK,
    ),
    Scenario(
        "etcd_member_isolated",
        "etcd: the clients' member cut from everyone (network namespaces)",
        member_isolated,
        backends=("etcd",),
        needs="partition",
        ok_states=LOST_OK,
    ),
    Scenario(
        "etcd_quorum_lost",
        "etcd: two of three members down past a lease",
        quorum_lost,
        backends=("etcd",),
        ok_states=LOST_OK,
    ),
)
"""The etcd scenarios, registered in :data:`fault.scenarios.SCENARIOS`."""
