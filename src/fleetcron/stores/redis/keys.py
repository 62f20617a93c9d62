"""How the Redis store names its keys: the hash tag of a name, and glob escaping for SCAN.

Shared by the leases and the ledger (:mod:`.operations`) and the work queue (:mod:`.queue`),
which build every key of theirs under the hash tag of some name, so that each operation
touches one Cluster slot: a job's row, runs and slot index under its lease's tag, a
namespace's replicas under one tag of their own; and the SCAN patterns that find them.
"""

from __future__ import annotations

from fleetcron.models import job_lease_name

__all__ = [
    "all_jobs_pattern",
    "glob_escape",
    "is_lease_key",
    "job_key",
    "job_name",
    "job_namespace",
    "jobs_pattern",
    "lease_key",
    "namespace_pattern",
    "replica_index_key",
    "replica_key",
    "run_key",
    "slots_key",
    "slots_pattern",
]


def glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN ``MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def lease_key(namespace: str, name: str) -> str:
    """The hash-tagged key of a lease; the length prefix keeps ``ns``/``name`` unambiguous."""
    return f"fleetcron:{{{len(namespace)}:{namespace}:{name}}}"


def namespace_pattern(namespace: str) -> str:
    """SCAN pattern of every key of ``namespace``."""
    return f"fleetcron:{{{len(namespace)}:{glob_escape(namespace)}:*"


def _job_base(namespace: str, job: str) -> str:
    return lease_key(namespace, job_lease_name(job))


def job_key(namespace: str, job: str) -> str:
    """The job row: under the hash tag of the job's lease."""
    return _job_base(namespace, job) + ":job"


def run_key(namespace: str, job: str, slot_us: int) -> str:
    """The run row of one slot: under the hash tag of the job's lease."""
    return f"{_job_base(namespace, job)}:run:{slot_us}"


def slots_key(namespace: str, job: str) -> str:
    """The sorted set of a job's slots (score = slot_us): under the job lease's hash tag."""
    return _job_base(namespace, job) + ":slots"


def replica_index_key(namespace: str) -> str:
    """The sorted set of a namespace's replicas (score = ``expires_us``)."""
    return lease_key(namespace, "fleetcron:replicas") + ":index"


def replica_key(namespace: str, replica_id: str) -> str:
    """One replica's heartbeat hash: under the hash tag of its namespace's index."""
    return f"{lease_key(namespace, 'fleetcron:replicas')}:replica:{replica_id}"


def jobs_pattern(namespace: str) -> str:
    """SCAN pattern of every job row of ``namespace`` (never a lease key: those end with
    ``}``; never a run row or slot index: their suffix differs)."""
    prefix = glob_escape(job_lease_name(""))
    return f"fleetcron:{{{len(namespace)}:{glob_escape(namespace)}:{prefix}*}}:job"


def job_namespace(key: str) -> str | None:
    """The namespace of a job row's key (see :func:`job_key`), ``None`` for another key:
    the length prefix says where the namespace ends, whatever characters it holds."""
    length, colon, rest = key.removeprefix("fleetcron:{").partition(":")
    if not colon or not length.isdigit() or not key.endswith("}:job"):
        return None
    namespace, tail = rest[: int(length)], rest[int(length) :]
    return namespace if tail.startswith(":" + job_lease_name("")) else None


def job_name(namespace: str, key: str) -> str | None:
    """The job whose row ``key`` is in ``namespace`` (see :func:`job_key`), ``None`` for
    another key."""
    prefix, suffix = job_key(namespace, "").removesuffix("}:job"), "}:job"
    if not key.startswith(prefix) or not key.endswith(suffix) or len(key) == len(prefix) + 5:
        return None
    return key[len(prefix) : -len(suffix)]


def slots_pattern(namespace: str) -> str:
    """SCAN pattern of every slot index of ``namespace``: the jobs that have runs, whether
    or not their job row still exists (``job_delete`` keeps the runs it does not own)."""
    prefix = glob_escape(job_lease_name(""))
    return f"fleetcron:{{{len(namespace)}:{glob_escape(namespace)}:{prefix}*}}:slots"


def is_lease_key(key: str) -> bool:
    """Lease keys end with the closing brace of their hash tag; ledger keys never do."""
    return key.endswith("}")


def all_jobs_pattern() -> str:
    """SCAN pattern of every job row of every namespace (:func:`job_namespace` reads each
    one's namespace)."""
    prefix = glob_escape(job_lease_name(""))
    return f"fleetcron:{{*:{prefix}*}}:job"
