"""Three etcd members, each in a network namespace of its own, joined by a router
namespace, so a test can cut links between them: a member from its peers (its clients
still reach it), or from everyone.

Layout (names start with a prefix of this object's own; ``S`` is a /16 of 10.0.0.0/8 no
route of the host uses)::

    root namespace (the test, its clients)  10.S.250.1 ── 10.S.250.2  router namespace
    member i's namespace                    10.S.i.2   ── 10.S.i.1    router namespace

The router forwards between its links (``ip_forward`` is set in its namespace only); the
root namespace gets one route, 10.S.0.0/16 via the router, removed on :meth:`close`
with every namespace and link. A cut is a policy rule in the router: ``blackhole`` for
packets between two members' /24s (:meth:`cut_from_peers`), or the member's link down
(:meth:`isolate`). Needs root and ``ip`` (iproute2): a test is skipped without them, and
fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
from typing import NoReturn

import pytest

from etcd_server import EtcdCluster

__all__ = ["EtcdNetCluster", "netns_available"]


def _missing(message: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def netns_available() -> str | None:
    """Why network namespaces cannot be made here (``None``: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "ip (iproute2) is not installed"
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def _free_subnet() -> int:
    """An ``S`` whose 10.S.0.0/16 overlaps no route of the root namespace."""
    routes = subprocess.run(["ip", "-o", "route"], capture_output=True, text=True).stdout
    used = []
    for line in routes.splitlines():
        first = line.split()[0]
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(first, strict=False))
    for _ in range(100):
        candidate = 100 + secrets.randbelow(150)
        net = ipaddress.ip_network(f"10.{candidate}.0.0/16")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return candidate
    raise RuntimeError("no free 10.S.0.0/16 for the test's namespaces")


class EtcdNetCluster(EtcdCluster):
    """:class:`~etcd_server.EtcdCluster` of ``size`` members, each in its own network
    namespace (see the module's docstring)."""

    def __init__(self, size: int = 3, *, wait: float = 30.0) -> None:
        problem = netns_available()
        if problem is not None:
            _missing(problem)
        self._tag = f"fc{secrets.token_hex(3)}"
        self._subnet = _free_subnet()
        self._router = f"{self._tag}r"
        self._spaces = [f"{self._tag}m{i}" for i in range(size)]
        self._routed = False
        self._rules: set[tuple[int, int]] = set()
        try:
            self._build(size)
            super().__init__(
                size,
                wait=wait,
                hosts=[self._member_address(i) for i in range(size)],
                wrap=lambda index: ["ip", "netns", "exec", self._spaces[index]],
            )
        except BaseException:
            self._teardown()
            raise

    def _member_address(self, index: int) -> str:
        return f"10.{self._subnet}.{index}.2"

    def _link(self, index: int) -> str:
        return f"{self._tag}l{index}"

    def _build(self, size: int) -> None:
        s, router, tag = self._subnet, self._router, self._tag
        _ip("netns", "add", router)
        _ip("link", "set", "lo", "up", netns=router)
        subprocess.run(
            ["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
            timeout=30,
        )
        _ip("link", "add", f"{tag}h", "type", "veth", "peer", "name", f"{tag}hr")
        _ip("link", "set", f"{tag}hr", "netns", router)
        _ip("addr", "add", f"10.{s}.250.1/30", "dev", f"{tag}h")
        _ip("link", "set", f"{tag}h", "up")
        _ip("addr", "add", f"10.{s}.250.2/30", "dev", f"{tag}hr", netns=router)
        _ip("link", "set", f"{tag}hr", "up", netns=router)
        _ip("route", "add", f"10.{s}.0.0/16", "via", f"10.{s}.250.2")
        self._routed = True
        for index, space in enumerate(self._spaces[:size]):
            outer, inner = self._link(index), f"{tag}x{index}"
            _ip("netns", "add", space)
            _ip("link", "set", "lo", "up", netns=space)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "netns", router)
            _ip("link", "set", inner, "netns", space)
            _ip("addr", "add", f"10.{s}.{index}.1/24", "dev", outer, netns=router)
            _ip("link", "set", outer, "up", netns=router)
            _ip("addr", "add", f"{self._member_address(index)}/24", "dev", inner, netns=space)
            _ip("link", "set", inner, "up", netns=space)
            _ip("route", "add", "default", "via", f"10.{s}.{index}.1", netns=space)

    # -- cuts

    def _rule(self, verb: str, a: int, b: int) -> None:
        _ip(
            "rule",
            verb,
            "from",
            f"10.{self._subnet}.{a}.0/24",
            "to",
            f"10.{self._subnet}.{b}.0/24",
            "blackhole",
            netns=self._router,
        )

    def cut_from_peers(self, member: int) -> None:
        """Drop every packet between ``member`` and the other members (both ways); its
        clients still reach it."""
        for other in range(len(self.members)):
            if other != member:
                for pair in ((member, other), (other, member)):
                    if pair not in self._rules:
                        self._rule("add", *pair)
                        self._rules.add(pair)

    def isolate(self, member: int) -> None:
        """Take ``member``'s link down: nothing reaches it, peers nor clients."""
        _ip("link", "set", self._link(member), "down", netns=self._router)

    def mend(self) -> None:
        """Undo every cut."""
        for pair in sorted(self._rules):
            self._rule("del", *pair)
        self._rules.clear()
        for index in range(len(self.members)):
            _ip("link", "set", self._link(index), "up", netns=self._router)

    # -- cleanup

    def _teardown(self) -> None:
        if self._routed:
            with contextlib.suppress(RuntimeError):
                _ip("route", "del", f"10.{self._subnet}.0.0/16")
            self._routed = False
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", f"{self._tag}h")  # its peer in the router goes with it
        for space in [*self._spaces, self._router]:
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", space)  # a namespace's links go with it

    def close(self) -> None:
        super().close()
        self._teardown()
