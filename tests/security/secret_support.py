"""What the tests of secrets share: the password every URL carries, the secrets a store
holds (holder tokens), planting them, and the check that a text holds none of them.

A holder is ``host:pid:token``; the token (20 hex digits) is what releasing or extending
someone else's lease would take, so only ``host:pid`` may be shown (DESIGN.md §2).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fleetcron.environment import SECRET_VARS
from fleetcron.models import SlotClaim
from fleetcron.scheduling.leadership import LEADER_LEASE
from fleetcron.stores import SyncStore
from redis_server import RedisServer

__all__ = [
    "DUMP_ENV",
    "FRAGMENT",
    "PASSWORD",
    "WEB_TOKEN",
    "Planted",
    "Ran",
    "RunCli",
    "SecretRedis",
    "Spawn",
    "assert_clean_environment",
    "assert_no_secret",
    "holder_tokens",
    "plant",
    "secret_variables",
    "with_password",
]

# What no output may hold. It has characters a URL must percent-encode, and a run of
# plain ones (FRAGMENT) that each form of it — as written, encoded, decoded — contains.
PASSWORD = "fc/Wd9s3cr@t# y+z"
FRAGMENT = "Wd9s3cr"
WEB_TOKEN = "dashboard-token-5f1d0c2b9e8a7d6c"
S = 1_000_000
DEFINITION = json.dumps(
    {
        "schedule": {"kind": "every", "every_us": 60 * S},
        "timezone": "UTC",
        "lock_at_most_us": 300 * S,
    }
)

# A command that writes its environment to the file its argument names (the file, not
# its output: what a run prints is masked, what it writes elsewhere is not).
DUMP_ENV = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


Spawn = Callable[..., subprocess.Popen[str]]
"""The ``spawn`` fixture: ``spawn(argv, env=…, name=…)``."""


@dataclass(frozen=True)
class Ran:
    """What one command of the CLI did."""

    argv: tuple[str, ...]
    status: int
    stdout: str
    stderr: str

    def texts(self) -> list[tuple[str, str]]:
        """``(where, text)`` of its stdout and stderr, for :func:`assert_no_secret`."""
        command = " ".join(self.argv)
        return [(f"{command} (stdout)", self.stdout), (f"{command} (stderr)", self.stderr)]


RunCli = Callable[..., Ran]
"""The ``run_cli`` fixture: ``run_cli(url, *argv, env=None)``."""


@dataclass(frozen=True)
class SecretRedis:
    """A Redis server of the test's own that requires :data:`PASSWORD`."""

    server: RedisServer
    url: str  # with the password
    wrong_url: str  # with another one


def with_password(url: str, password: str = PASSWORD) -> str:
    """``url`` with ``password`` (percent-encoded) in its userinfo."""
    parts = urllib.parse.urlsplit(url)
    user = parts.username or ""
    netloc = f"{user}:{urllib.parse.quote(password, safe='')}@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def secret_variables(url: str) -> dict[str, str]:
    """Variables a job's environment must not get: the store's and the dashboard's
    credentials by name, and unrelated names holding the password in any form."""
    return {
        "FLEETCRON_WEB_TOKEN": WEB_TOKEN,
        "PGPASSWORD": PASSWORD,
        "MYSQL_PWD": PASSWORD,
        "REDISCLI_AUTH": PASSWORD,
        "APP_DATABASE_URL": url,
        "APP_DSN": f"host=db user=app password={PASSWORD}",
        "APP_ENCODED": urllib.parse.quote(PASSWORD, safe=""),
        "KEEP_ME": "kept",
    }


def assert_clean_environment(env: dict[str, str], url: str) -> None:
    """A job's environment: no credential variable, no value with a secret in it."""
    assert not set(SECRET_VARS) & set(env), sorted(set(SECRET_VARS) & set(env))
    leaking = {k for k, v in env.items() if FRAGMENT in v or url in v or WEB_TOKEN in v}
    assert not leaking, sorted(leaking)
    assert env["KEEP_ME"] == "kept"


@dataclass(frozen=True)
class Planted:
    """Store state whose holders carry tokens the test knows."""

    tokens: tuple[str, ...]
    job: str  # registered, with a running run


def plant(store: SyncStore, namespace: str) -> Planted:
    """A held lease ``report``, the leader lease, and a registered job ``export`` with a
    running run — each held by a holder with a fresh secret token."""
    ops = store.ops
    tokens = tuple(secrets.token_hex(10) for _ in range(3))
    assert store.run(ops.lease_acquire(namespace, "report", f"host-a:17:{tokens[0]}", 300 * S, 0))
    assert store.run(
        ops.lease_acquire(namespace, LEADER_LEASE, f"host-b:18:{tokens[1]}", 300 * S, 0)
    )
    store.run(ops.job_register(namespace, [("export", DEFINITION, "e" * 32)]))
    now = store.run(ops.store_now())
    claim = SlotClaim(job="export", slot_us=now - now % (60 * S), run_id="planted-run")
    [answer] = store.run(ops.run_claim(namespace, [claim], f"host-c:19:{tokens[2]}", 300 * S))
    assert answer.status == "claimed", answer
    return Planted(tokens=tokens, job="export")


def holder_tokens(store: SyncStore, namespace: str) -> set[str]:
    """The token of every holder the store has for ``namespace``: leases and ledger rows."""
    holders = [lease.holder for lease in store.run(store.ops.lease_list(namespace))]
    holders += [run.holder for run in store.run(store.ops.run_list(namespace, None, 1000))]
    tokens = {holder.rpartition(":")[2] for holder in holders if holder.count(":") >= 2}
    return {token for token in tokens if len(token) >= 16}


def assert_no_secret(texts: Iterable[tuple[str, str]], *secrets_: str) -> None:
    """No text (``(where, text)`` pairs) holds the password (any form) or a secret."""
    for where, text in texts:
        for secret in (FRAGMENT, *secrets_):
            assert secret not in text, f"{secret!r} is in {where}:\n{text[:3000]}"
