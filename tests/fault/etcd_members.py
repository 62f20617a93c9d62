"""An etcd cluster the fault suite owns: three members of :class:`etcd_server.EtcdCluster`
behind the store-server API the generic scenarios use (``url``, ``restart``, ``pause``,
``resume``, ``close``), and per-member fault proxies.

A generic scenario that restarts or pauses "the store" acts on every member at once —
the whole cluster crashes or freezes, the worst case; the etcd scenarios
(:mod:`fault.etcd_failover`) act on one member through :attr:`EtcdMembers.cluster`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from etcd_netns import EtcdNetCluster
from etcd_server import EtcdCluster
from fault.proxy import FaultProxy

__all__ = ["EtcdMembers", "ProxyGroup", "proxied_etcd_url"]

PREFIX = "/fault"


class EtcdMembers:
    """Three etcd members of the run's own, started and healthy once built; with
    ``partitionable``, each in a network namespace of its own
    (:class:`etcd_netns.EtcdNetCluster`: links between them can be cut)."""

    def __init__(self, size: int = 3, *, partitionable: bool = False) -> None:
        self.cluster = EtcdNetCluster(size) if partitionable else EtcdCluster(size)

    @property
    def url(self) -> str:
        """``etcd://m1,m2,m3/fault``: every member, the keys under one prefix."""
        return self.cluster.url + PREFIX

    def restart(self) -> None:
        """SIGKILL every member (a power cut of the cluster) and start them again on their
        data; returns once they follow one leader."""
        for index in range(len(self.cluster.members)):
            self.cluster.kill9(index)
        self.cluster.heal()

    def pause(self) -> None:
        """SIGSTOP every member."""
        for index in range(len(self.cluster.members)):
            self.cluster.pause(index)

    def resume(self) -> None:
        """SIGCONT every member; returns once they follow one leader again."""
        self.cluster.heal()

    def close(self) -> None:
        self.cluster.close()


class ProxyGroup:
    """One :class:`~fault.proxy.FaultProxy` per member, driven as one: a fault applies to
    every member's link (the client is cut from the whole cluster); counts are summed."""

    def __init__(self, proxies: list[FaultProxy]) -> None:
        self.proxies = proxies

    def __getattr__(self, name: str) -> Any:
        methods = [getattr(proxy, name) for proxy in self.proxies]

        def each(*args: Any, **kwargs: Any) -> Any:
            results = [method(*args, **kwargs) for method in methods]
            if all(isinstance(result, int) for result in results):
                return sum(results)
            return None

        return each

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()


def proxied_etcd_url(url: str) -> tuple[str, ProxyGroup]:
    """A proxy in front of each member of ``url``, and the URL that goes through them."""
    parts = urlsplit(url)
    proxies: list[FaultProxy] = []
    members = []
    for member in parts.netloc.split(","):
        host, _, port = member.rpartition(":")
        proxy = FaultProxy((host, int(port)))
        proxies.append(proxy)
        members.append(f"{host}:{proxy.port}")
    return urlunsplit(parts._replace(netloc=",".join(members))), ProxyGroup(proxies)
