"""The environment a job's command runs with: the caller's, less the store's credentials."""

from __future__ import annotations

from collections.abc import Mapping

from fleetcron.scrub import credentials

__all__ = ["SECRET_VARS", "child_environment"]

SECRET_VARS = (
    "FLEETCRON_BACKEND",
    "FLEETCRON_BACKEND_FILE",
    "PGPASSWORD",
    "MYSQL_PWD",
    "REDISCLI_AUTH",
    "FLEETCRON_WEB_TOKEN",  # the dashboard's actions: a job must not trigger or pause jobs
)


def child_environment(
    base: Mapping[str, str], backend_url: str | None, extra: Mapping[str, str]
) -> dict[str, str]:
    """The command's environment: ``base`` less the store's credentials, plus ``extra``:
    :data:`SECRET_VARS` and every variable whose value holds the backend URL or one of
    its passwords (userinfo or ``?password=``, as written or percent-decoded)."""
    secrets = [backend_url, *credentials(backend_url)] if backend_url else []
    env = {
        key: value
        for key, value in base.items()
        if key not in SECRET_VARS and not any(secret in value for secret in secrets)
    }
    env.update(extra)
    return env
