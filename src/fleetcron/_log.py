"""The ``fleetcron`` logger. Every record that reports an event carries ``extra["action"]``."""

from __future__ import annotations

import logging

__all__ = ["log"]

log = logging.getLogger("fleetcron")
