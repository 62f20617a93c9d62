"""The web dashboard: ``fleetcron web`` and ``fleetcron run --web`` (needs the ``web``
extra: ``pip install 'fleetcron[web]'``).

:func:`create_app` is the ASGI application — the pages ``/``, ``/jobs/{name}`` and
``/leases``, and the JSON API under ``/api/`` — over an open async store; an application
can mount it itself. :class:`WebServer` serves it on the running event loop.
"""

from __future__ import annotations

from fleetcron.web.app import TOKEN_ENV, create_app
from fleetcron.web.server import WebServer, bind

__all__ = ["TOKEN_ENV", "WebServer", "bind", "create_app"]
