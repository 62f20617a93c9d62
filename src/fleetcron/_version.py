"""The package's version: a leaf module, so that what reports it (pings, the replica
table, ``--version``) imports no more than this."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"
