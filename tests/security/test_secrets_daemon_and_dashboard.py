"""The daemon and its dashboard keep the store's password, the holders' tokens and the
dashboard's own token to themselves.

``fleetcron run JOBS --web 127.0.0.1:0`` on PostgreSQL, its URL (with a password) in
``FLEETCRON_BACKEND`` and its environment full of credentials (``FLEETCRON_WEB_TOKEN``,
``PGPASSWORD``, a DSN holding the password…), runs a command job and an isolated
(``isolate = "process"``) job that write their environment to files, and a slow job that
holds its lease while the dashboard is read:

- neither job's environment holds a credential variable or a value with the password, the
  URL or the dashboard's token;
- every page and JSON document of the dashboard — jobs, a job's ledger, leases, replicas,
  status, and the 404s — and the daemon's JSON logs and output hold neither the password
  nor any holder's token (the running job's, the planted leases', the leader's) nor the
  dashboard's token;
- over real HTTP, an action without the token, with a wrong one, with the token in the
  query string, a cross-site form post without it, or one whose ``Host`` is not the
  loopback (DNS rebinding) is refused and changes nothing — while the right token works.

And a dashboard whose store (a Redis requiring the password) goes away answers 503 naming
the problem, with the password nowhere in the page, the JSON or the log.
"""

from __future__ import annotations

import json
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from e2e.helpers import FLEETCRON, wait_for
from fleetcron.models import RunRecord
from fleetcron.stores import SyncStore, open_store, parse_store_url
from security.secret_support import (
    WEB_TOKEN,
    SecretRedis,
    Spawn,
    assert_clean_environment,
    assert_no_secret,
    holder_tokens,
    plant,
    secret_variables,
)

COMMAND_DUMP = (
    "import json, os, sys; json.dump(dict(os.environ), "
    "open(os.path.join(sys.argv[1], 'command-' + os.environ['FLEETCRON_FENCE'] + '.json'), 'w'))"
)
ISOLATED_MODULE = """\
import json
import os
from pathlib import Path


def dump(ctx):
    Path(__file__).with_name(f"isolated-{ctx.fence}.json").write_text(json.dumps(dict(os.environ)))
"""
# Holds its lease until the test lets it go (a file), so the daemon stops without a drain.
SLOW = (
    "import os, sys, time; open(sys.argv[1], 'w').close()\n"
    "while not os.path.exists(sys.argv[2]): time.sleep(0.05)"
)
PAGES = [
    ("/", 200),
    ("/leases", 200),
    ("/jobs/slow", 200),
    ("/jobs/dump", 200),
    ("/jobs/export", 200),
    ("/api/status", 200),
    ("/api/leases", 200),
    ("/api/jobs/slow/runs", 200),
    ("/api/jobs/export/runs", 200),
    ("/jobs/nosuch", 404),
    ("/api/nothing", 404),
]
Response = tuple[int, str, dict[str, str]]


def _http(
    method: str, url: str, *, headers: dict[str, str] | None = None, body: bytes | None = None
) -> Response:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def _address(stderr: Path) -> str:
    """The dashboard's address, from the ``web_serving`` line of the JSON log."""

    def logged() -> str | None:
        for line in stderr.read_text().split("\n")[:-1]:  # whole lines only
            entry = json.loads(line)
            if entry.get("action") == "web_serving":
                return str(entry["address"]).rstrip("/")
        return None

    return wait_for(logged, timeout=60, what="the dashboard to listen")


def _runs(store: SyncStore, namespace: str, job: str) -> list[RunRecord]:
    return store.run(store.ops.run_list(namespace, job, 100))


def test_the_daemon_its_jobs_and_its_dashboard_keep_every_secret(
    postgres_secret_url: str,
    namespace: str,
    tmp_path: Path,
    environment: dict[str, str],
    spawn: Spawn,
) -> None:
    url = postgres_secret_url
    store = open_store(parse_store_url(url))
    try:
        planted = plant(store, namespace)
        envs = tmp_path / "envs"
        envs.mkdir()
        marker, release = tmp_path / "slow-started", tmp_path / "slow-may-end"
        (envs / "envdump.py").write_text(ISOLATED_MODULE)
        jobs = envs / "jobs.toml"
        jobs.write_text(
            f'[jobs.dump]\nevery = "1s"\n'
            f"command = {json.dumps([sys.executable, '-c', COMMAND_DUMP, str(envs)])}\n\n"
            f'[jobs.isolated]\nevery = "1s"\ncall = "envdump:dump"\nisolate = "process"\n\n'
            f'[jobs.slow]\nevery = "1s"\nlock_at_most = "5m"\n'
            f"command = {json.dumps([sys.executable, '-c', SLOW, str(marker), str(release)])}\n"
        )
        env = {**environment, "FLEETCRON_BACKEND": url, **secret_variables(url)}
        argv = [*FLEETCRON, "--namespace", namespace, "--log-format", "json", "-v", "run"]
        daemon = spawn([*argv, str(jobs), "--web", "127.0.0.1:0"], env=env, name="daemon")
        base = _address(tmp_path / "daemon.err")

        def ran_all() -> bool:
            running = [r for r in _runs(store, namespace, "slow") if r.state == "running"]
            return bool(
                running
                and marker.exists()
                and list(envs.glob("command-*.json"))
                and list(envs.glob("isolated-*.json"))
            )

        wait_for(ran_all, timeout=60, what="each job to run, and slow to hold its lease")
        responses = {path: _http("GET", base + path) for path, _ in PAGES}
        assert {path: r[0] for path, r in responses.items()} == dict(PAGES)

        # -- the actions over HTTP: refused without the token, whatever the disguise ----
        port = base.rpartition(":")[2]
        refusals = {
            "no token": ("/api/jobs/slow/pause", {}, None),
            "wrong token": ("/api/jobs/slow/pause", {"Authorization": "Bearer guess"}, None),
            "token in the query": (f"/api/jobs/slow/trigger?token={WEB_TOKEN}", {}, None),
            "token as a cookie": ("/api/jobs/slow/trigger", {"Cookie": f"token={WEB_TOKEN}"}, None),
            "cross-site form": (
                "/jobs/slow/pause",
                {
                    "Origin": "https://evil.example",
                    "Referer": "https://evil.example/page",
                    "Sec-Fetch-Site": "cross-site",
                    "Content-Type": "application/x-www-form-urlencoded",
                },
                b"token=",
            ),
            "rebound host": (
                "/api/jobs/slow/pause",
                {"Authorization": f"Bearer {WEB_TOKEN}", "Host": f"evil.example:{port}"},
                None,
            ),
        }
        for what, (path, headers, body) in refusals.items():
            status, text, _ = _http("POST", base + path, headers=headers, body=body or b"")
            assert status in (400, 401, 403), (what, status, text)
            responses[f"POST {path} ({what})"] = (status, text, {})
        slow = store.run(store.ops.job_get(namespace, "slow"))
        assert slow is not None
        assert not slow.paused
        assert not [r for r in _runs(store, namespace, "slow") if r.trigger == "manual"]
        auth = {"Authorization": f"Bearer {WEB_TOKEN}"}
        for action, paused in (("pause", True), ("resume", False)):  # the token itself works
            status, text, _ = _http("POST", f"{base}/api/jobs/dump/{action}", headers=auth)
            assert (status, json.loads(text)["paused"]) == (200, paused), text

        release.touch()
        wait_for(
            lambda: all(r.state != "running" for r in _runs(store, namespace, "slow")),
            timeout=30,
            what="the slow job to end",
        )
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
        out = (tmp_path / "daemon.out").read_text()
        err = (tmp_path / "daemon.err").read_text()
        tokens = set(planted.tokens) | holder_tokens(store, namespace)
        assert len(tokens) >= 4  # the planted ones and the daemon's own
    finally:
        store.close()

    for line in err.splitlines():
        json.loads(line)
    texts = [(where, f"{r[1]}\n{r[2]}") for where, r in responses.items()]
    assert_no_secret([*texts, ("daemon stdout", out), ("daemon stderr", err)], *tokens, WEB_TOKEN)
    dumped = sorted(envs.glob("command-*.json")) + sorted(envs.glob("isolated-*.json"))
    for dump in dumped:
        assert_clean_environment(json.loads(dump.read_text()), url)


def test_a_dashboard_whose_store_goes_away_says_so_without_the_password(
    redis_secret: SecretRedis,
    namespace: str,
    tmp_path: Path,
    environment: dict[str, str],
    spawn: Spawn,
) -> None:
    env = {**environment, "FLEETCRON_BACKEND": redis_secret.url, "FLEETCRON_WEB_TOKEN": WEB_TOKEN}
    argv = [*FLEETCRON, "--namespace", namespace, "--log-format", "json", "web"]
    web = spawn([*argv, "--listen", "127.0.0.1:0"], env=env, name="web")
    base = _address(tmp_path / "web.err")
    assert _http("GET", base + "/api/status")[0] == 200

    redis_secret.server.close()  # SIGKILL: the store is gone
    auth = {"Authorization": f"Bearer {WEB_TOKEN}"}
    responses = {
        "/api/status": _http("GET", base + "/api/status"),
        "/": _http("GET", base + "/"),
        "/leases": _http("GET", base + "/leases"),
        "trigger": _http("POST", base + "/api/jobs/report/trigger", headers=auth, body=b""),
    }
    assert {what: r[0] for what, r in responses.items()} == dict.fromkeys(responses, 503)
    assert "the store could not be read" in responses["/api/status"][1]
    assert "Store unavailable" in responses["/"][1]

    web.send_signal(signal.SIGTERM)
    assert web.wait(timeout=60) == 0
    err = (tmp_path / "web.err").read_text()
    assert "web_store_error" in err  # the failure is logged…
    texts = [(what, f"{r[1]}\n{r[2]}") for what, r in responses.items()]
    assert_no_secret([*texts, ("web stderr", err)], WEB_TOKEN)  # …without the password
