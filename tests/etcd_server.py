"""etcd members of a test's own: 1 or 3 on spare loopback ports, in a temporary directory
(under /dev/shm when there is one: etcd syncs its log on every write), with raft timings
short enough for failover tests; stopped by pid. The machine's services are never touched.

Needs the ``etcd`` binary (Debian's ``etcd-server``, 3.4+), and ``openssl`` for a cluster
that serves its clients over TLS: a test is skipped without them, and fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from ports import spare_port

__all__ = ["EtcdCluster", "etcd_binary", "self_signed_certificate"]

# Heartbeat every 50 ms, an election after 500 ms without one: a lost leader is replaced
# within about a second, and a loaded two-core machine does not miss heartbeats enough
# to start elections of its own (etcd's defaults are 100 ms and 1 s).
_RAFT_FLAGS = ("--heartbeat-interval", "50", "--election-timeout", "500")
_PROBE_TIMEOUT_S = 0.5


def _missing(message: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def etcd_binary() -> str:
    """The ``etcd`` binary; skips the test when there is none (fails under ``CI=true``)."""
    found = shutil.which("etcd") or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None
    )
    if found is None:
        _missing("etcd is not installed (Debian: apt-get install etcd-server)")
    return found


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """``(certificate, key)`` for 127.0.0.1, valid for a day, made with ``openssl``: the
    certificate is its own CA (what a client is told to trust)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        _missing("openssl is not installed (Debian: apt-get install openssl)")
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


def _stopped(task: Path) -> bool:
    """Whether the thread at ``/proc/PID/task/TID`` is stopped (or gone)."""
    try:
        stat = (task / "stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


@dataclass
class _Member:
    name: str
    client_port: int
    peer_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    member_id: int = 0
    host: str = "127.0.0.1"

    @property
    def log(self) -> Path:
        return self.directory.with_suffix(".log")


class EtcdCluster:
    """``size`` etcd members (1 or 3) forming one new cluster, healthy once built.

    Members are named by their index in :attr:`endpoints`. :meth:`kill9`, :meth:`pause`
    and :meth:`resume` act on one member's process; :meth:`heal` undoes them;
    :meth:`close` stops every member and removes the directory. ``tls``: the members serve
    clients over HTTPS with a self-signed certificate (:attr:`ca_file`); peers talk HTTP.
    ``hosts``: each member's address, where it listens on ports 2379 (clients) and 2380
    (peers) — a network namespace of its own (:mod:`etcd_netns`) — instead of spare
    loopback ports; ``wrap``: the words that run member ``index``'s command there."""

    def __init__(
        self,
        size: int = 1,
        *,
        tls: bool = False,
        wait: float = 30.0,
        hosts: Sequence[str] | None = None,
        wrap: Callable[[int], list[str]] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one member")
        self._binary = etcd_binary()
        parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix="fleetcron-etcd-", dir=parent))
        self.tls = tls
        self.ca_file: Path | None = None
        self._tls_flags: list[str] = []
        if tls:
            try:
                cert, key = self_signed_certificate(self.root)
            except BaseException:
                shutil.rmtree(self.root, ignore_errors=True)
                raise
            self.ca_file = cert
            self._tls_flags = ["--cert-file", str(cert), "--key-file", str(key)]
        self._token = f"fleetcron-test-{os.getpid()}-{self.root.name}"
        self._wrap = wrap or (lambda _index: [])
        if hosts is not None:
            self.members = [
                _Member(f"m{i}", 2379, 2380, self.root / f"m{i}", host=host)
                for i, host in enumerate(hosts)
            ]
        else:
            self.members = [
                _Member(f"m{i}", spare_port(), spare_port(), self.root / f"m{i}")
                for i in range(size)
            ]
        try:
            for index in range(size):
                self._start(index)
            self.wait_healthy(wait)
        except BaseException:
            self.close()
            raise

    # -- addresses

    @property
    def endpoints(self) -> list[tuple[str, int]]:
        """Every member's client address, by index."""
        return [(m.host, m.client_port) for m in self.members]

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:p1,127.0.0.1:p2,...``: the backend URL of the cluster."""
        return "etcd://" + ",".join(f"{host}:{port}" for host, port in self.endpoints)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts the members' certificate (TLS clusters only)."""
        if self.ca_file is None:
            raise RuntimeError("this cluster serves plain HTTP")
        return ssl.create_default_context(cafile=str(self.ca_file))

    def member_id(self, member: int) -> int:
        """The raft ID of member ``member`` (as response headers name it)."""
        return self.members[member].member_id

    # -- processes

    def _start(self, index: int) -> None:
        member = self.members[index]
        initial = ",".join(f"{m.name}=http://{m.host}:{m.peer_port}" for m in self.members)
        client = f"{'https' if self.tls else 'http'}://{member.host}:{member.client_port}"
        peer = f"http://{member.host}:{member.peer_port}"
        command = [
            *self._wrap(index),
            self._binary,
            "--name",
            member.name,
            "--data-dir",
            str(member.directory),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            initial,
            "--initial-cluster-token",
            self._token,
            "--initial-cluster-state",
            "new",  # ignored by a member restarted on its data
            *_RAFT_FLAGS,
            *self._tls_flags,
        ]
        # etcd reads its flags from ETCD_* variables too: none of the caller's may leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        with member.log.open("ab") as log:
            member.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        member.paused = False

    def _process(self, member: int) -> subprocess.Popen[bytes]:
        process = self.members[member].process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"etcd member {member} is not running")
        return process

    def kill9(self, member: int) -> None:
        """SIGKILL member ``member`` and reap it."""
        process = self._process(member)
        process.kill()
        process.wait(10)
        self.members[member].process = None
        self.members[member].paused = False

    def pause(self, member: int) -> None:
        """SIGSTOP member ``member``: it keeps its sockets (connections are accepted by
        the kernel) and answers nothing, the worst a member can do to a client. Returns
        once every thread of it has stopped (a signal is delivered to a running thread
        only when it next enters the kernel)."""
        pid = self._process(member).pid
        os.kill(pid, signal.SIGSTOP)
        self.members[member].paused = True
        tasks = Path(f"/proc/{pid}/task")
        if not tasks.is_dir():
            return  # no /proc: the signal's delivery cannot be watched
        give_up = time.monotonic() + 5
        while not all(_stopped(task) for task in tasks.iterdir()):
            if time.monotonic() > give_up:
                pytest.fail(f"etcd member {member} (pid {pid}) did not stop within 5 s")
            time.sleep(0.005)  # polling the threads' states, bounded above

    def resume(self, member: int) -> None:
        """SIGCONT member ``member``."""
        os.kill(self._process(member).pid, signal.SIGCONT)
        self.members[member].paused = False

    def restart(self, member: int) -> None:
        """Start member ``member`` again on its data (after :meth:`kill9`)."""
        if self.members[member].process is not None:
            raise RuntimeError(f"etcd member {member} is running")
        self._start(member)

    def heal(self, wait: float = 30.0) -> None:
        """Resume the paused members, restart the killed ones, wait until healthy."""
        for index, member in enumerate(self.members):
            if member.process is None or member.process.poll() is not None:
                member.process = None
                self.restart(index)
            elif member.paused:
                self.resume(index)
        self.wait_healthy(wait)

    def close(self) -> None:
        """Stop every member by pid (SIGKILL: the data goes too) and remove the directory."""
        for member in self.members:
            process = member.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)  # a stopped process dies only then
                    process.kill()
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)
            member.process = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- state

    def post(self, member: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One gateway call to member ``member`` on a connection of its own (status and
        JSON answer), outside any client under test."""
        host, port = self.endpoints[member]
        conn = (
            http.client.HTTPSConnection(
                host, port, timeout=_PROBE_TIMEOUT_S, context=self.ssl_context()
            )
            if self.tls
            else http.client.HTTPConnection(host, port, timeout=_PROBE_TIMEOUT_S)
        )
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read() or b"{}")
        finally:
            conn.close()
        return response.status, answer if isinstance(answer, dict) else {}

    def _status(self, member: int) -> dict[str, Any] | None:
        if self.members[member].paused or self.members[member].process is None:
            return None
        try:
            status, answer = self.post(member, "/v3/maintenance/status", {})
        except (OSError, http.client.HTTPException, ValueError):
            return None
        return answer if status == 200 else None

    def _until(self, what: str, wait: float, found: Callable[[], int | None]) -> int:
        give_up = time.monotonic() + wait
        while True:
            for member in self.members:
                if member.process is not None and member.process.poll() is not None:
                    log = member.log.read_text(errors="replace")[-3000:]
                    pytest.fail(f"etcd member {member.name} exited: {log}")
            value = found()
            if value is not None:
                return value
            if time.monotonic() > give_up:
                pytest.fail(f"etcd cluster in {self.root}: {what} within {wait:g} s")
            time.sleep(0.05)  # polling the members' status, bounded above

    def _leader_now(self, *, everyone: bool) -> int | None:
        """The index of the leader every answering member follows, when it answers too
        (and, with ``everyone``, when every member answers)."""
        statuses = {i: self._status(i) for i in range(len(self.members))}
        live = {i: s for i, s in statuses.items() if s is not None}
        if not live or (everyone and len(live) < len(self.members)):
            return None
        for index, status in live.items():
            self.members[index].member_id = int(status["header"]["member_id"])
        leaders = {int(s.get("leader", 0)) for s in live.values()}  # left out: none
        leader = leaders.pop() if len(leaders) == 1 else 0
        return next((i for i in live if leader and self.members[i].member_id == leader), None)

    def leader(self, wait: float = 15.0) -> int:
        """The index of the leader that every running, unpaused member follows (waiting
        until they agree and the leader answers itself)."""
        return self._until(
            "no leader that every live member follows",
            wait,
            lambda: self._leader_now(everyone=False),
        )

    def wait_healthy(self, wait: float = 30.0) -> None:
        """Wait until every member runs, answers and follows one leader."""
        if any(m.process is None or m.paused for m in self.members):
            raise RuntimeError("a member is stopped or paused: heal() first")
        self._until("not every member healthy", wait, lambda: self._leader_now(everyone=True))
