"""``fleetcron run`` with ``[queues.NAME]`` workers: two replicas drain one queue, each
item handled once, a failing item dead after its attempts, and the counts in the metrics."""

from __future__ import annotations

import functools
import json
import signal
import urllib.request
from collections import Counter
from pathlib import Path

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, Spawned, wait_for
from fleetcron import Fleet
from ports import spare_port

HANDLER = """
import os, time

def handle(item):
    with open(os.environ["HANDLED"], "a") as out:
        out.write(f"{os.getpid()} {item.item_id} {item.value}\\n")
    if item.value == 13:
        raise ValueError("thirteen")
    time.sleep(0.01)
"""


def stop(replica: Spawned) -> str:
    replica.proc.send_signal(signal.SIGTERM)
    result = replica.wait(timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def _counted(port: int, outcome: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    wanted = f'fleetcron_queue_items_total{{outcome="{outcome}",queue="work"}} '
    return sum(float(line[len(wanted) :]) for line in text.splitlines() if line.startswith(wanted))


@CROSS_PROCESS_BACKENDS
def test_two_replicas_drain_a_queue_each_item_once(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "queue_handler.py").write_text(HANDLER)
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        '[queues.work]\ncall = "queue_handler:handle"\nbatch = 5\nworkers = 2\n'
        'retry_backoff = "0s"\nidle = "50ms"\n'
    )
    handled = tmp_path / "handled.txt"
    with Fleet(cli.backend, namespace=cli.namespace) as fleet:
        queue = fleet.queue("work", max_attempts=2)  # the producer says: two deliveries
        ids = queue.put_many(range(60))
        ports = [spare_port(), spare_port()]
        env = {"HANDLED": str(handled)}
        replicas = [
            cli.spawn("run", str(jobs), "--metrics", f"127.0.0.1:{port}", env=env) for port in ports
        ]

        def drained() -> bool:
            stats = queue.stats()
            return stats.depth == 0 and stats.done + stats.dead == 60

        wait_for(drained, timeout=60, what="the queue to be drained")

        # Each replica counts what its workers acknowledged, once the ack has returned.
        def counted(outcome: str) -> float:
            return sum(_counted(port, outcome) for port in ports)

        # 61 deliveries: 59 acknowledged, and item 13 twice (failed, then dead).
        for outcome, count in (("acked", 59), ("claimed", 61), ("dead", 1), ("failed", 1)):
            wait_for(
                functools.partial(lambda o, c: counted(o) == c, outcome, count),
                timeout=30,
                what=f"{count} {outcome} item(s) in the replicas' metrics",
            )
        errors = [stop(replica) for replica in replicas]
        stats = queue.stats()
        (dead,) = queue.items(states=["dead"])

    shown = json.loads(cli.run("status", "--json").stdout)["queues"]
    assert shown == [
        {
            "queue": "work",
            "ready": 0,
            "scheduled": 0,
            "claimed": 0,
            "done": 59,
            "dead": 1,
            "oldest_waiting_s": 0.0,
        }
    ]
    text = cli.run("status").stdout
    assert "queues:" in text
    assert "work" in text.split("queues:")[1]

    lines = [line.split() for line in handled.read_text().splitlines()]
    times = Counter(int(item_id) for _pid, item_id, _value in lines)
    assert sorted(times) == sorted(i for i in ids if i is not None)
    assert times[dead.item_id] == 2, "the failing item: two deliveries, then dead"
    assert all(n == 1 for item_id, n in times.items() if item_id != dead.item_id)
    assert (stats.done, stats.dead) == (59, 1)
    assert dead.error == "ValueError: thirteen"
    assert any("item" in err and "failed" in err for err in errors)
