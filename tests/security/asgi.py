"""Calling the dashboard's ASGI application as uvicorn does, without a server.

Starlette's ``TestClient`` percent-decodes a request's path twice (httpx hands it the
decoded path, which it decodes again), so a job named ``a%20b`` would reach the app as
``a b``. A real server decodes once; so does :class:`Asgi`, which builds the request's
scope as uvicorn does — ``path`` is the raw path decoded once, the query string as sent
— and runs the app for one request on an event loop of its own.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

__all__ = ["Asgi", "Response"]


@dataclass(frozen=True)
class Response:
    status_code: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Asgi:
    """One-request-at-a-time client of an ASGI app, listening at ``host``."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1:8080") -> None:
        self.app = app
        self.host = host

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        content: bytes | str = b"",
    ) -> Response:
        """``url`` is the request target as sent: a percent-encoded path and query."""
        raw_path, _, query = url.partition("?")
        body = content.encode() if isinstance(content, str) else content
        sent = {"host": self.host, **{k.lower(): v for k, v in (headers or {}).items()}}
        if body:
            sent.setdefault("content-length", str(len(body)))
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": urllib.parse.unquote(raw_path),
            "raw_path": raw_path.encode("ascii"),
            "query_string": query.encode("ascii"),
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in sent.items()],
            "server": ("127.0.0.1", 8080),
            "client": ("127.0.0.1", 50000),
        }
        return asyncio.run(self._call(scope, body))

    async def _call(self, scope: dict[str, Any], body: bytes) -> Response:
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        status = 0
        headers: dict[str, str] = {}
        chunks: list[bytes] = []

        async def receive() -> Message:
            if pending:
                return pending.pop()
            await asyncio.Event().wait()  # the client never disconnects mid-request
            raise AssertionError("unreachable")

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers.update(
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in message["headers"]
                )
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return Response(status, headers, b"".join(chunks).decode("utf-8", "replace"))

    def post(self, url: str, **kwargs: Any) -> Response:
        return self.request("POST", url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> Response:
        return self.request("GET", url, **kwargs)
