"""``fleetcron web [--listen HOST:PORT]``: the dashboard, and ``run --web`` beside the jobs.

The token that actions need comes from ``$FLEETCRON_WEB_TOKEN``; without it the dashboard
only shows. The address is bound before the store is opened, so a port in use or a bad
address exits 2 with nothing started. ``web`` serves a store that is there: it never
creates or migrates one (a mistyped URL exits 78 at start); its actions change rows of
jobs the replicas registered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fleetcron._log import log
from fleetcron.errors import ConfigurationError
from fleetcron.names import resolve_namespace
from fleetcron.stores import AsyncStore, StoreURL, open_async_store, resolve_backend

__all__ = ["add_parser", "beside", "listen", "run", "web_token"]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)

TOKEN_ENV = "FLEETCRON_WEB_TOKEN"  # fleetcron.web.TOKEN_ENV, without importing starlette
DEFAULT_LISTEN = "127.0.0.1:8080"
_SHORT_TOKEN = 16


def add_parser(commands: argparse._SubParsersAction[_Parser], parents: Sequence[_Parser]) -> None:
    """Declare ``web``."""
    web = commands.add_parser(
        "web",
        parents=list(parents),
        help="serve the dashboard: jobs, ledger, leases, replicas (HTML and JSON)",
        description="Serve the dashboard of the namespace, read from the store on each "
        f"request. Actions (trigger, pause, resume) need ${TOKEN_ENV}.",
    )
    web.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_LISTEN}; ':8080' is every interface)",
    )


def web_token() -> str | None:
    """The actions' token from ``$FLEETCRON_WEB_TOKEN`` (``None``: actions are refused)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        return None
    if len(token) < _SHORT_TOKEN:
        log.warning(
            "%s is %d characters long: use a long random one (openssl rand -hex 32)",
            TOKEN_ENV,
            len(token),
            extra={"action": "web_warning"},
        )
    return token


def listen(where: str, option: str) -> socket.socket:
    """Bind the dashboard's address now (the ``web`` extra is needed)."""
    try:
        from fleetcron.web.server import bind
    except ImportError as exc:
        raise ConfigurationError(
            f"{option}: the dashboard needs its extra: pip install 'fleetcron[web]' ({exc.name})"
        ) from None
    return bind(where, option=option)


async def _serve(
    listener: socket.socket, store: AsyncStore, namespace: str, work: Awaitable[None] | None
) -> None:
    """Serve the dashboard until ``work`` ends (or, without work, until SIGTERM/SIGINT)."""
    from fleetcron.web.app import LOOPBACK_HOSTS, create_app
    from fleetcron.web.server import WebServer, address_url, is_loopback

    token = web_token()
    hosts = LOOPBACK_HOSTS if is_loopback(listener) else None
    server = WebServer(create_app(store, namespace, token, allowed_hosts=hosts), listener)
    url = address_url(listener)
    if token is not None and not is_loopback(listener):
        log.warning(
            "the dashboard at %s takes its token over plain HTTP: put it behind TLS "
            "(a reverse proxy) or listen on 127.0.0.1",
            url,
            extra={"action": "web_warning", "address": url},
        )
    log.info(
        "dashboard of namespace %r at %s (%s)",
        namespace,
        url,
        "actions need the token" if token else f"read-only: {TOKEN_ENV} is not set",
        extra={"action": "web_serving", "address": url, "namespace": namespace},
    )
    serving = asyncio.ensure_future(server.serve())
    if work is None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        await serving
        return
    try:
        await work
    finally:
        server.stop()
        try:
            await serving
        except Exception:  # the dashboard's failure never hides the jobs' outcome
            log.exception("the dashboard failed", extra={"action": "web_failed"})


async def beside(
    work: Callable[[], Awaitable[None]],
    listener: socket.socket,
    url: StoreURL,
    store: AsyncStore,
    namespace: str,
) -> None:
    """``run --web``: serve the dashboard on this event loop while ``work()`` (the
    scheduler) runs, over a store connection of its own — so reading the dashboard never
    waits behind, or delays, a lease renewal — except for ``memory://``, which only this
    process's ``store`` holds."""
    own = None if url.kind == "memory" else await open_async_store(url)
    try:
        await _serve(listener, own or store, namespace, work())
    finally:
        if own is not None:
            await own.close()


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    namespace = resolve_namespace(getattr(args, "namespace", None))
    url = resolve_backend(getattr(args, "backend", None))
    listener = listen(args.listen, "--listen")  # before the store: a bad address starts nothing

    async def main() -> None:
        store = await open_async_store(url, existing=True)
        try:
            await _serve(listener, store, namespace, None)
        finally:
            await store.close()

    try:
        asyncio.run(main())
    finally:
        listener.close()
    return 0
