"""A Redis Cluster and a Sentinel deployment of a test's own, on spare loopback ports.

``RedisCluster``: three masters and three replicas (``redis-cli --cluster create
--cluster-replicas 1``), ready when every node says ``cluster_state:ok`` and every master
has its replica. ``RedisSentinels``: a master, a replica and three sentinels watching it
(quorum 2). Both: processes killed and directories removed by :meth:`close`; a node can be
SIGKILLed or paused to fail it over. The machine's Redis is never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import redis.sentinel

from ports import spare_port

__all__ = ["RedisCluster", "RedisSentinels"]

T = TypeVar("T")
_READY_S = 60.0


def _client(port: int, **options: Any) -> Any:
    """A client of one node (redis-py's command methods are untyped: used through Any)."""
    return redis.Redis(port=port, socket_timeout=1, **options)


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed (scripts/services installs redis)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def _wait(condition: Callable[[], T | None], what: str, timeout: float = _READY_S) -> T:
    give_up = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > give_up:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)  # polling a server's state, bounded above


class _Nodes:
    """Redis processes of one deployment, in a temporary directory."""

    def __init__(self, prefix: str) -> None:
        self.root = Path(
            tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
        )
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, port: int, options: list[str], *, binary: str = "redis-server") -> None:
        directory = self.root / str(port)
        directory.mkdir()
        command = [
            _binary(binary),
            *options,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.processes[port] = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait(lambda: redis.Redis(port=port, socket_timeout=1).ping(), f"redis on {port}", 20)

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (a crash)."""
        process = self.processes[port]
        process.kill()
        process.wait(20)

    def pause(self, port: int) -> None:
        os.kill(self.processes[port].pid, signal.SIGSTOP)

    def resume(self, port: int) -> None:
        os.kill(self.processes[port].pid, signal.SIGCONT)

    def close(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(20)
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)


class RedisCluster:
    """Three masters and three replicas; :attr:`url` is ``redis+cluster://`` with two of
    the six nodes (the client finds the rest)."""

    def __init__(self, *, node_timeout_ms: int = 2000) -> None:
        self.nodes = _Nodes("fleetcron-redis-cluster-")
        self.ports = [spare_port() for _ in range(6)]
        try:
            for port in self.ports:
                self.nodes.start(
                    port,
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--cluster-node-timeout",
                        str(node_timeout_ms),
                        # The bus port, else port + 10000 (over 65535 for a high spare).
                        "--cluster-port",
                        str(spare_port()),
                    ],
                )
            subprocess.run(
                [
                    _binary("redis-cli"),
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{port}" for port in self.ports),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            _wait(self._ready, "the cluster to be ok with a replica per master")
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}"

    def _ready(self) -> bool:
        for port in self.ports:
            info = redis.Redis(port=port, socket_timeout=1, decode_responses=True).cluster("INFO")
            if info.get("cluster_state") != "ok":
                return False
        replicas = self.replicas()
        # Synced: a replica that never was is not promoted (its data is too old).
        return len(replicas) == 3 and all(
            redis.Redis(port=port, socket_timeout=1).info("replication").get("master_link_status")
            == "up"
            for port in replicas
        )

    def masters(self) -> list[int]:
        return [port for port in self.ports if self.role(port) == "master"]

    def replicas(self) -> list[int]:
        return [port for port in self.ports if self.role(port) == "slave"]

    def role(self, port: int) -> str | None:
        if self.nodes.processes[port].poll() is not None:
            return None
        try:
            reply = _client(port).execute_command("ROLE")
        except (redis.RedisError, OSError):
            return None
        role = reply[0]
        return role.decode() if isinstance(role, bytes) else str(role)

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot."""
        client = _client(self.masters()[0])
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return int(master[1])
        raise RuntimeError(f"no master serves slot {slot}")

    def close(self) -> None:
        self.nodes.close()


class RedisSentinels:
    """A master, its replica, and three sentinels (quorum 2) watching it as
    :attr:`service`; :attr:`url` is ``redis+sentinel://`` naming the sentinels."""

    service = "fleetcron"

    def __init__(self, *, down_after_ms: int = 1000) -> None:
        self.nodes = _Nodes("fleetcron-redis-sentinel-")
        self.master_port, self.replica_port = spare_port(), spare_port()
        self.sentinel_ports = [spare_port() for _ in range(3)]
        try:
            self.nodes.start(self.master_port, [])
            self.nodes.start(self.replica_port, ["--replicaof", "127.0.0.1", str(self.master_port)])
            _wait(self._replicated, "the replica to sync")
            for port in self.sentinel_ports:
                config = self.nodes.root / f"sentinel-{port}.conf"
                config.write_text(
                    f"sentinel monitor {self.service} 127.0.0.1 {self.master_port} 2\n"
                    f"sentinel down-after-milliseconds {self.service} {down_after_ms}\n"
                    f"sentinel failover-timeout {self.service} 10000\n"
                    f"sentinel parallel-syncs {self.service} 1\n"
                )
                self.nodes.start(port, [str(config), "--sentinel"])
            _wait(self._watched, "every sentinel to see the replica and each other")
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def _replicated(self) -> bool:
        info = redis.Redis(port=self.replica_port, socket_timeout=1).info("replication")
        return info.get("master_link_status") == "up"

    def _watched(self) -> bool:
        for port in self.sentinel_ports:
            client = _client(port, decode_responses=True)
            fields = client.sentinel_master(self.service)
            if int(fields["num-slaves"]) < 1 or int(fields["num-other-sentinels"]) < 2:
                return False
        return True

    def current_master(self) -> int:
        client = _client(self.sentinel_ports[0])
        _host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)

    def close(self) -> None:
        self.nodes.close()


def raw_client(url: str) -> redis.Redis | redis.RedisCluster:
    """A plain redis-py client of a ``redis://``, ``redis+cluster://`` or
    ``redis+sentinel://`` URL, for a test to read or break keys behind the store."""
    scheme, _, rest = url.partition("://")
    if scheme == "redis+cluster":
        host, _, port = rest.split(",")[0].partition(":")
        return redis.RedisCluster(host=host, port=int(port))
    if scheme == "redis+sentinel":
        hosts, _, service = rest.partition("/")
        sentinels = [(h, int(p)) for h, _, p in (part.partition(":") for part in hosts.split(","))]
        sentinel: Any = redis.sentinel.Sentinel
        master: redis.Redis = sentinel(sentinels).master_for(service)
        return master
    return redis.Redis.from_url(url)
