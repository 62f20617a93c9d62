"""The environment a job's command runs with: the caller's, less the store's credentials."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

__all__ = ["SECRET_VARS", "child_environment"]

SECRET_VARS = ("FLEETCRON_BACKEND", "PGPASSWORD", "MYSQL_PWD", "REDISCLI_AUTH")


def child_environment(
    base: Mapping[str, str], backend_url: str | None, extra: Mapping[str, str]
) -> dict[str, str]:
    """The command's environment: ``base`` less the store's credentials, plus ``extra``."""
    secrets: list[str] = []
    if backend_url:
        secrets.append(backend_url)
        try:
            parts = urllib.parse.urlsplit(backend_url)
            passwords = [parts.password or ""]
        except ValueError:
            parts, passwords = None, []
        if parts is not None:  # also ?password=… (libpq and others accept it)
            passwords += [
                value
                for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
                if "password" in key.lower()
            ]
        for password in filter(None, passwords):
            secrets.extend({password, urllib.parse.unquote(password)})
    env = {
        key: value
        for key, value in base.items()
        if key not in SECRET_VARS and not any(secret in value for secret in secrets)
    }
    env.update(extra)
    return env
