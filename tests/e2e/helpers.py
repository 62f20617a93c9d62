"""Running the ``fleetcron`` CLI as subprocesses, and waiting on conditions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from services import STORES

__all__ = [
    "CROSS_PROCESS_BACKENDS",
    "FLEETCRON",
    "Cli",
    "Spawned",
    "alive",
    "assert_clean_error",
    "read_when_written",
    "wait_for",
]

T = TypeVar("T")

_SCRIPT = Path(sys.executable).with_name("fleetcron")
FLEETCRON: tuple[str, ...] = (
    (str(_SCRIPT),)
    if _SCRIPT.exists()
    else (sys.executable, "-c", "from fleetcron.cli.main import entry; entry()")
)

# memory:// lives in one process, so it cannot take part in cross-process tests.
CROSS_PROCESS_BACKENDS = pytest.mark.parametrize("backend_url", STORES, indirect=True)


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "",
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which nobody reaps in a container, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def assert_clean_error(
    result: subprocess.CompletedProcess[str], status: int, *fragments: str
) -> None:
    """A user-facing failure: ``status``, one ``fleetcron:`` line on stderr, no traceback."""
    stderr = result.stderr
    assert "Traceback" not in stderr, stderr
    assert result.returncode == status, (result.returncode, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("fleetcron: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


class Spawned:
    """A background ``fleetcron`` process whose output goes to files."""

    def __init__(self, proc: subprocess.Popen[str], stdout: Path, stderr: Path) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._stdout = stdout
        self._stderr = stderr

    def poll(self) -> int | None:
        return self.proc.poll()

    def stderr_so_far(self) -> str:
        """What the process has written to its stderr so far (it may still be running)."""
        return self._stderr.read_text()

    def wait(self, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Wait for the exit; the status and output as ``subprocess.run`` gives them."""
        status = self.proc.wait(timeout=timeout)
        return subprocess.CompletedProcess(
            self.proc.args, status, self._stdout.read_text(), self._stderr.read_text()
        )


class Cli:
    """The ``fleetcron`` command bound to one backend and one namespace.

    Every process it spawns, and every process group registered with ``track_group``,
    is SIGKILLed at teardown so nothing outlives the test.
    """

    def __init__(self, backend: str, namespace: str, workdir: Path) -> None:
        self.backend = backend
        self.namespace = namespace
        self.workdir = workdir
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCRON_")}
        env["XDG_STATE_HOME"] = str(workdir / "xdg-state")  # never the user's default store
        self.env = env
        self._procs: list[Spawned] = []
        self._spawned = 0
        self._groups: list[int] = []

    def argv(self, *args: str, flags: bool = True) -> list[str]:
        scope = ["--backend", self.backend, "--namespace", self.namespace] if flags else []
        return [*FLEETCRON, *scope, *args]

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {**self.env, **(extra or {})}

    def run(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        flags: bool = True,
        timeout: float = 60,
        prefix: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``fleetcron [--backend … --namespace …] ARGS`` to completion."""
        return subprocess.run(
            [*prefix, *self.argv(*args, flags=flags)],
            env=self._env(env),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def spawn(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> Spawned:
        """Start ``fleetcron … ARGS`` in the background (killed at teardown).

        Output goes to files, not pipes: a grandchild that inherited a pipe would keep
        it open and make reading the output hang.
        """
        self._spawned += 1
        out = self.workdir / f"spawned-{self._spawned}.out"
        err = self.workdir / f"spawned-{self._spawned}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                [*prefix, *self.argv(*args)],
                env=self._env(env),
                cwd=self.workdir,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        spawned = Spawned(proc, out, err)
        self._procs.append(spawned)
        return spawned

    def track_group(self, pgid: int) -> None:
        self._groups.append(pgid)

    def locks(self) -> list[dict[str, Any]]:
        result = self.run("locks", "--json")
        assert result.returncode == 0, result.stderr
        rows: list[dict[str, Any]] = json.loads(result.stdout)
        return rows

    def lease(self, name: str) -> dict[str, Any] | None:
        return next((row for row in self.locks() if row["name"] == name), None)

    def held(self, name: str) -> dict[str, Any] | None:
        row = self.lease(name)
        return row if row is not None and row["held"] else None

    def cleanup(self) -> None:
        for pgid in self._groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for spawned in self._procs:
            if spawned.proc.poll() is None:
                spawned.proc.kill()
            spawned.proc.wait()


def read_when_written(path: Path, *, timeout: float = 10.0) -> str:
    """The content of ``path`` once it exists and ends with a newline."""

    def complete() -> str | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return text if text.endswith("\n") else None

    return wait_for(complete, timeout=timeout, what=f"{path} to be written")
