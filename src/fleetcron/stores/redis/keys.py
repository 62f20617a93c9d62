"""How the Redis store names its keys: the hash tag of a name, and glob escaping for SCAN.

Shared by the leases and the ledger (:mod:`.operations`) and the work queue (:mod:`.queue`),
which build every key of theirs under the hash tag of some name, so that each operation
touches one Cluster slot.
"""

from __future__ import annotations

__all__ = ["glob_escape", "lease_key"]


def glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN ``MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def lease_key(namespace: str, name: str) -> str:
    """The hash-tagged key of a lease; the length prefix keeps ``ns``/``name`` unambiguous."""
    return f"fleetcron:{{{len(namespace)}:{namespace}:{name}}}"
