"""What an operation yields to its runner: a :class:`Statement`.

An operation (:data:`~fleetcron.stores.base.Operation`) yields statements and is sent back
their answers. Each backend brings its own kinds, subclasses of :class:`Statement` kept
with it, and its runner carries out those and refuses any other:

======================================  =================  ==========================
statements                              runner             module
======================================  =================  ==========================
``Query``, ``QueryBatch``               SQL (sync, async)  ``stores/sql/statements.py``
``Script``, ``ScriptCalls``, ``KeyScan``  Redis              ``stores/redis/statements.py``
``Step``                                memory             ``stores/memory_state.py``
======================================  =================  ==========================

Parameters and arguments are always bound by the driver, never interpolated into text.
"""

from __future__ import annotations

__all__ = ["Statement"]


class Statement:
    """The base of every statement kind; an operation of one backend yields only that
    backend's kinds."""

    __slots__ = ()
