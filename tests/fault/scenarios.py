"""The scenarios: each drives real processes against a real store and injects its faults.

A body never asserts the guarantees itself — the checker does, over the histories and the
ledger. A body only makes sure the fault really happened (a holder was found and killed,
the store was really down) and raises :class:`~fault.runner.ScenarioFailed` when it did
not, so a scenario can never pass by not testing anything.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable

from fault.runner import Proc, Run, Scenario, ScenarioFailed, wait_until

__all__ = ["SCENARIOS", "by_name"]

SECOND = 1_000_000
# A run whose replica died or froze ends "lost" (recovered by another replica): an honest
# outcome of that slot, not an anomaly.
_LOST_OK = frozenset({"succeeded", "lost"})


def _holder_proc(run: Run, procs: list[Proc], name: str = "res") -> Proc:
    """Wait until one of ``procs`` holds ``name`` and return it."""
    by_pid = {proc.pid: proc for proc in procs if proc.alive()}

    def holder() -> Proc | None:
        with run.store() as store:
            record = store.run(store.ops.lease_get(run.namespace, name))
        if record is None or not record.held:
            return None
        pid = int(record.holder.split(":")[-2])
        return by_pid.get(pid)

    found: Proc = wait_until(holder, timeout=30, what=f"a holder of {name} among the workers")
    return found


def _grants(run: Run) -> int:
    return sum(1 for event in run.histories() if event.event == "acquire_ok")


def _require_grants(run: Run, at_least: int) -> None:
    got = _grants(run)
    if got < at_least:
        raise ScenarioFailed(f"only {got} grants in the history (expected ≥ {at_least})")


# -- lock scenarios -----------------------------------------------------------------------
def baseline_race(run: Run) -> None:
    """Six contenders, no fault: the race itself."""
    procs = run.lockers(6, ttl_ms=2000, hold_ms=10, writes=2, duration_s=3)
    run.wait_exit(procs)
    _require_grants(run, 20)


def holder_sigkill(run: Run) -> None:
    """The holder is SIGKILLed mid-hold, three times; the others take over at expiry."""
    procs = run.lockers(4, ttl_ms=800, hold_ms=400, writes=4, duration_s=6)
    for _ in range(3):
        victim = _holder_proc(run, procs)
        victim.signal(signal.SIGKILL)
        run.fault(f"SIGKILL {victim.worker}")
        victim.popen.wait(10)
    run.wait_exit([proc for proc in procs if proc.alive()])
    _require_grants(run, 4)


def _sigstop_holder(run: Run, *, ttl_ms: int, pause_factor: float, rounds: int) -> None:
    procs = run.lockers(3, ttl_ms=ttl_ms, hold_ms=ttl_ms // 2, writes=6, duration_s=8)
    for _ in range(rounds):
        victim = _holder_proc(run, procs)
        victim.signal(signal.SIGSTOP)
        run.fault(f"SIGSTOP {victim.worker} for {pause_factor}× the lease")
        # The pause is the fault itself, measured on the store's clock: resume once the
        # store has moved on by that much, however loaded this machine is.
        run.wait_store_time(int(ttl_ms * 1000 * pause_factor), "the pause to elapse")
        victim.signal(signal.SIGCONT)
    run.wait_exit(procs)
    _require_grants(run, 4)


def holder_sigstop_short(run: Run) -> None:
    """The holder is paused for a third of its lease, twice: it keeps it."""
    _sigstop_holder(run, ttl_ms=1500, pause_factor=0.33, rounds=2)


def holder_sigstop_long(run: Run) -> None:
    """The holder is paused for twice its lease, twice: another takes over; the paused one
    must stop without a write the resource accepts out of order."""
    _sigstop_holder(run, ttl_ms=800, pause_factor=2.0, rounds=2)


def keepalive_holders(run: Run) -> None:
    """Holders that renew (keepalive) and extend explicitly, holding longer than the lease."""
    procs = run.lockers(
        4, ttl_ms=600, hold_ms=900, writes=6, duration_s=5, keepalive=True, extend=True
    )
    run.wait_exit(procs)
    _require_grants(run, 3)


def delayed_responses(run: Run) -> None:
    """One contender's connection delays every byte by more than the lease: what it is
    granted has expired before it hears of it, and it must not act on it."""
    url, proxy = run.proxied()
    run.lockers(3, ttl_ms=500, hold_ms=100, writes=3, duration_s=5, start=False)
    slow = run.lockers(1, ttl_ms=500, hold_ms=100, writes=3, duration_s=5, url=url, start=False)
    proxy.delay(0.7)
    run.fault("delay 0.7s on one contender's connection")
    run.go([proc for proc in run.procs if proc.role == "locker"])
    run.wait_exit(run.procs)
    _require_grants(run, 5)
    del slow


def blackhole_holder(run: Run) -> None:
    """The holder's connection is blackholed for longer than its lease while it renews:
    it must stop before its lease can go to another."""
    url, proxy = run.proxied()
    others = run.lockers(2, ttl_ms=1000, hold_ms=200, writes=2, duration_s=6, start=False)
    victim = run.lockers(
        1,
        ttl_ms=1000,
        hold_ms=2500,
        writes=10,
        duration_s=6,
        keepalive=True,
        url=url,
        start=False,
    )
    run.go(victim)
    _holder_proc(run, victim)
    run.go(others)
    proxy.blackhole()
    run.fault("blackhole the holder's connection")
    run.wait_store_time(2_500_000)
    proxy.pass_()
    run.wait_exit(run.procs)
    _require_grants(run, 3)


def reset_connections(run: Run) -> None:
    """Every connection of two contenders is reset every few hundred milliseconds."""
    url, proxy = run.proxied()
    procs = run.lockers(2, ttl_ms=800, hold_ms=50, writes=2, duration_s=5, url=url)
    procs += run.lockers(2, ttl_ms=800, hold_ms=50, writes=2, duration_s=5)
    rng = random.Random(7)
    while any(proc.alive() for proc in procs):
        time.sleep(rng.uniform(0.1, 0.4))  # the fault's rhythm, not a wait for an event
        proxy.reset()
        run.fault("reset connections")
    _require_grants(run, 5)


def jittery_latency(run: Run) -> None:
    """Latency around the lease length, with jitter, on half the contenders."""
    url, proxy = run.proxied()
    proxy.delay(0.3, jitter=0.3)
    run.fault("delay 0.3±0.3 s")
    procs = run.lockers(2, ttl_ms=500, hold_ms=50, writes=2, duration_s=5, url=url)
    procs += run.lockers(2, ttl_ms=500, hold_ms=50, writes=2, duration_s=5)
    run.wait_exit(procs)
    _require_grants(run, 5)


def _skewed(offset_s: int) -> Callable[[Run], None]:
    def body(run: Run) -> None:
        from fault.clock import faketime_env

        env = faketime_env(offset_s)
        run.fault(f"client clocks {offset_s:+d}s on half the contenders")
        procs = run.lockers(2, ttl_ms=800, hold_ms=30, writes=2, duration_s=4, env=env)
        procs += run.lockers(2, ttl_ms=800, hold_ms=30, writes=2, duration_s=4)
        run.wait_exit(procs)
        _require_grants(run, 8)

    body.__doc__ = f"Half the contenders run with their clock {offset_s:+d} s off."
    return body


def store_restart(run: Run) -> None:
    """The store server is restarted (immediately, not cleanly) twice while contenders
    race; fences keep increasing across the restarts."""
    procs = run.lockers(4, ttl_ms=1000, hold_ms=30, writes=2, duration_s=9)
    for _ in range(2):
        wait_until(lambda: _grants(run) > 0, what="a grant before the restart")
        seen = _grants(run)
        run.server.restart()
        run.fault(f"restart the {run.backend} server")
        wait_until(
            lambda: _grants(run) > seen,  # noqa: B023 - used before the next iteration
            timeout=60,
            what="a grant after the restart",
        )
    run.wait_exit(procs)


def store_paused(run: Run) -> None:
    """The store server is SIGSTOPped for longer than the lease, then resumed."""
    procs = run.lockers(4, ttl_ms=800, hold_ms=200, writes=4, duration_s=8, keepalive=True)
    _holder_proc(run, procs)
    run.server.pause()
    run.fault(f"SIGSTOP the {run.backend} server for 2 s")
    time.sleep(2.0)  # the length of the fault itself; the store's clock is stopped with it
    run.server.resume()
    run.wait_exit(procs)
    _require_grants(run, 3)


# -- scheduler scenarios ------------------------------------------------------------------
def _window(run: Run, job: str) -> None:
    """Every one-second slot between the first and the last ledger row is expected."""
    rows = run.ledger(job)
    if not rows:
        raise ScenarioFailed(f"no ledger row for {job}")
    first = min(row.slot_us for row in rows)
    last = max(row.slot_us for row in rows)
    run.expected_slots[job] = list(range(first, last + 1, SECOND))


def replicas_baseline(run: Run) -> None:
    """Three replicas, a job every second: each slot once."""
    jobs = run.jobs_file(work_s=0.2)
    run.replicas(3, jobs)
    run.wait_runs("tick", 6)
    run.stop_all()
    _window(run, "tick")


def replica_sigkill(run: Run) -> None:
    """The replica running a slot is SIGKILLed, twice; the slot is recovered or recorded."""
    jobs = run.jobs_file(work_s=0.6, lock_at_most="1s")
    procs = run.replicas(3, jobs)
    for _ in range(2):
        victim = _running_replica(run, procs, "tick")
        victim.signal(signal.SIGKILL)
        run.fault(f"SIGKILL replica {victim.worker}")
        victim.popen.wait(10)
    run.wait_runs("tick", 6)
    run.stop_all()
    _window(run, "tick")


def replica_sigstop(run: Run) -> None:
    """The replica running a slot is SIGSTOPped past the lease, then resumed: nothing of
    its run may still be alive once another replica can take the slot."""
    jobs = run.jobs_file(work_s=2.5, lock_at_most="1s", extra='overlap = "skip"\n')
    procs = run.replicas(3, jobs)
    victim = _running_replica(run, procs, "tick")
    victim.signal(signal.SIGSTOP)
    run.fault(f"SIGSTOP replica {victim.worker} past its lease")
    run.wait_store_time(2_500_000)
    victim.signal(signal.SIGCONT)
    run.wait_runs("tick", 6)
    run.stop_all()
    _window(run, "tick")


def _running_replica(run: Run, procs: list[Proc], job: str) -> Proc:
    by_pid = {proc.pid: proc for proc in procs if proc.alive()}

    def running() -> Proc | None:
        for row in run.ledger(job):
            if row.state == "running" and row.holder:
                proc = by_pid.get(int(row.holder.split(":")[-2]))
                if proc is not None:
                    return proc
        return None

    found: Proc = wait_until(running, timeout=30, what=f"a running {job} on a live replica")
    return found


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("baseline_race", "six contenders, no fault", baseline_race, fast=True),
    Scenario("holder_sigkill", "the holder SIGKILLed mid-hold", holder_sigkill, fast=True),
    Scenario("holder_sigstop_short", "holder paused < lease", holder_sigstop_short),
    Scenario("holder_sigstop_long", "holder paused 2× the lease", holder_sigstop_long, fast=True),
    Scenario("keepalive_holders", "renewing holders", keepalive_holders),
    Scenario(
        "delayed_responses",
        "a contender's connection delayed past the lease",
        delayed_responses,
        backends=("postgres", "mysql", "redis"),
    ),
    Scenario(
        "blackhole_holder",
        "the holder's connection blackholed past its lease",
        blackhole_holder,
        backends=("postgres", "mysql", "redis"),
        fast=True,
    ),
    Scenario(
        "reset_connections",
        "connections reset mid-operation",
        reset_connections,
        backends=("postgres", "mysql", "redis"),
    ),
    Scenario(
        "jittery_latency",
        "latency about the lease, with jitter",
        jittery_latency,
        backends=("postgres", "mysql", "redis"),
    ),
    Scenario("client_clock_ahead", "client clocks +10 min", _skewed(600), fast=True),
    Scenario("client_clock_behind", "client clocks −10 min", _skewed(-600)),
    Scenario(
        "store_restart",
        "store server restarted (immediate) twice",
        store_restart,
        backends=("postgres", "mysql", "redis"),
        needs="owned",
    ),
    Scenario(
        "store_paused",
        "store server SIGSTOPped past the lease",
        store_paused,
        backends=("postgres", "mysql", "redis"),
        needs="owned",
    ),
    Scenario("replicas_baseline", "three replicas, a job every second", replicas_baseline),
    Scenario(
        "replica_sigkill",
        "the running replica SIGKILLed",
        replica_sigkill,
        ok_states=_LOST_OK,
    ),
    Scenario(
        "replica_sigstop",
        "the running replica paused past its lease",
        replica_sigstop,
        ok_states=_LOST_OK,
    ),
)


def by_name(name: str) -> Scenario:
    """The scenario called ``name``."""
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    known = ", ".join(s.name for s in SCENARIOS)
    raise KeyError(f"unknown scenario {name!r}; known: {known}")
