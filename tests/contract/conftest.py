"""Fixtures of the contract suite: an open store and a fleet on every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from fleetcron import AsyncFleet, Fleet
from fleetcron.stores import SyncStore, open_store, parse_store_url


@pytest.fixture
def store(backend_url: str) -> Iterator[SyncStore]:
    """A connected sync store of the backend under test (schema created on first use)."""
    opened = open_store(parse_store_url(backend_url))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def fleet(store: SyncStore, namespace: str) -> Iterator[Fleet]:
    """A fleet over :func:`store`, in this test's own namespace."""
    with Fleet(store, namespace=namespace) as opened:
        yield opened


@pytest.fixture
async def async_fleet(backend_url: str, namespace: str) -> AsyncIterator[AsyncFleet]:
    """An :class:`AsyncFleet` connected the public way, ``await AsyncFleet.connect(url)``."""
    connected = await AsyncFleet.connect(backend_url, namespace=namespace)
    try:
        yield connected
    finally:
        await connected.close()
