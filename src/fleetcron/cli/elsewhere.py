"""Where a reader who found nothing in a namespace may have meant to look: the store's
namespaces that hold jobs, with how many each holds (``status`` and ``runs``)."""

from __future__ import annotations

import difflib

from fleetcron.names import NAMESPACE_ENV
from fleetcron.stores import SyncStore
from fleetcron.stores.job_pages import job_pages_sync

__all__ = ["elsewhere"]

_SUGGESTED = 5  # namespaces listed at most when no namespace was chosen


def _counted(store: SyncStore, namespaces: list[str]) -> str:
    """``'example' (2 jobs)``, … for each of ``namespaces``."""
    parts = []
    for namespace in namespaces:
        jobs = sum(len(rows) for rows in job_pages_sync(store, namespace))
        parts.append(f"{namespace!r} ({jobs} job{'' if jobs == 1 else 's'})")
    return ", ".join(parts)


def elsewhere(store: SyncStore, namespace: str, chosen: bool) -> str:
    """Where the jobs are, for a reader that found none in ``namespace``: the namespaces
    with jobs whose names are close to it (a typo); all of them (up to a few, with their
    job counts) only when no namespace was chosen — on a store that several teams share,
    a team's mistyped namespace does not print the others' names."""
    others = [ns for ns in store.run(store.ops.job_namespaces()) if ns != namespace]
    close = difflib.get_close_matches(namespace, others, n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(repr(ns) for ns in close)}?"
    if not others:
        return "no namespace of this store has jobs yet: replicas register theirs when they start"
    if chosen:
        return "--namespace chooses another"
    listed = _counted(store, others[:_SUGGESTED]) + (", …" if len(others) > _SUGGESTED else "")
    return f"namespaces with jobs: {listed}; --namespace or ${NAMESPACE_ENV} chooses one"
