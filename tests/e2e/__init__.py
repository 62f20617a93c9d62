"""End-to-end tests: the ``fleetcron`` command line, run as subprocesses."""

from __future__ import annotations
