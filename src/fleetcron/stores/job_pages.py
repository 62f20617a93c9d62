"""Every job row of a namespace, read a page at a time (:meth:`Operations.job_page`).

A reader of every job of a namespace — the retention pass's orphan report, a standby
following the leader's progress, ``fleetcron prune`` — holds one page of rows at a time,
and reads them without their definitions unless it needs them: at 100,000 jobs the whole
job list with its definitions is about 80 MB of rows at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from fleetcron.models import JobRecord
from fleetcron.stores.base import AsyncStore, Operation, Operations, SyncStore

__all__ = ["JOB_PAGE", "after_page", "job_pages", "job_pages_sync", "page_of"]

JOB_PAGE = 1_000
"""Job rows per page: about 1 MB with their definitions, one round trip each."""


def page_of(
    ops: Operations, namespace: str, after: str, *, definitions: bool = False
) -> Operation[list[JobRecord]]:
    """The page of :data:`JOB_PAGE` rows after ``after``."""
    return ops.job_page(namespace, after, JOB_PAGE, definitions=definitions)


def after_page(rows: list[JobRecord]) -> str | None:
    """Where the page after ``rows`` (read by :func:`page_of`) starts; ``None`` when
    ``rows`` was the last."""
    return rows[-1].job if len(rows) >= JOB_PAGE else None


async def job_pages(
    store: AsyncStore, namespace: str, *, definitions: bool = False
) -> AsyncIterator[list[JobRecord]]:
    """The namespace's job rows, page after page (store errors propagate)."""
    after: str | None = ""
    while after is not None:
        rows = await store.run(page_of(store.ops, namespace, after, definitions=definitions))
        if rows:
            yield rows
        after = after_page(rows)


def job_pages_sync(
    store: SyncStore, namespace: str, *, definitions: bool = False
) -> Iterator[list[JobRecord]]:
    """:func:`job_pages` on a sync store."""
    after: str | None = ""
    while after is not None:
        rows = store.run(page_of(store.ops, namespace, after, definitions=definitions))
        if rows:
            yield rows
        after = after_page(rows)
