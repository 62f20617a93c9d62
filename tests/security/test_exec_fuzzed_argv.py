"""``fleetcron exec`` through the real CLI, on SQLite and PostgreSQL, with lock names and
command arguments full of shell, SQL and Lua metacharacters, newlines, Unicode, bytes
that are not UTF-8 and 4000-character arguments:

- the command receives its argv byte for byte — it is exec'd, never given to a shell (a
  ``$(touch pwned)``, a ``; touch pwned`` or a ``> pwned`` creates nothing);
- the lock (or, with ``--schedule``, the job) is the very name given: ``FLEETCRON_JOB``,
  the lease row, ``locks --json`` and the ledger give it back exactly;
- a name that looks like an option is never taken for one: it is refused, and nothing
  runs or is created where an injected ``--backend`` would point (argument parsing only:
  run in this process).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.helpers import Cli
from fleetcron.cli.exitcodes import EXIT_USAGE
from fleetcron.models import job_lease_name
from fleetcron.stores import SyncStore
from security.fuzzing import arguments, fuzz, job_names, names
from security.secret_support import RunCli

DUMP = (
    "import json, os, sys; json.dump({'argv': [os.fsencode(a).hex() for a in sys.argv[2:]], "
    "'job': os.environ.get('FLEETCRON_JOB'), 'slot': os.environ.get('FLEETCRON_SLOT')}, "
    "open(sys.argv[1], 'w'))"
)

# A name starting with '-' is an option to argparse (see the last test): not a NAME here.
_lock_names = names().filter(lambda n: not n.startswith("-"))
_job_names = job_names().filter(lambda n: not n.startswith("-"))


@pytest.fixture
def counter() -> Iterator[int]:
    return itertools.count()


@pytest.mark.parametrize("backend_url", ["sqlite", "postgres"], indirect=True)
def test_exec_passes_fuzzed_arguments_exactly_and_holds_the_fuzzed_name(
    backend_url: str,
    namespace: str,
    tmp_path: Path,
    store: SyncStore,
    counter: Iterator[int],
    make_cli: Callable[[str, str], Cli],
    run_cli: RunCli,
) -> None:
    plain: set[str] = set()  # names exec'd without --schedule, all in `namespace`

    @st.composite
    def invocation(draw: st.DrawFn) -> tuple[str, bool, list[str]]:
        scheduled = draw(st.booleans())
        name = draw(_job_names if scheduled else _lock_names)
        return name, scheduled, draw(arguments)

    def check(case: tuple[str, bool, list[str]]) -> None:
        name, scheduled, args = case
        n = next(counter)
        out = tmp_path / f"seen-{n}.json"
        ns = f"{namespace}-{n}" if scheduled else namespace  # a slot runs once per namespace
        options = ["--schedule", "* * * * *"] if scheduled else []
        result = make_cli(backend_url, ns).run(
            "exec", name, *options, "--", sys.executable, "-c", DUMP, str(out), *args
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        seen = json.loads(out.read_text())
        assert seen["argv"] == [os.fsencode(arg).hex() for arg in args]
        assert seen["job"] == name
        assert (seen["slot"] is not None) == scheduled
        assert not [p.name for p in tmp_path.iterdir() if "pwned" in p.name]
        assert not Path("/pwned.db").exists()

        lease_name = job_lease_name(name) if scheduled else name
        record = store.run(store.ops.lease_get(ns, lease_name))
        assert record is not None, lease_name
        assert (record.name, record.held) == (lease_name, False)
        if scheduled:
            runs = store.run(store.ops.run_list(ns, name, 10))
            assert [(run.job, run.state, run.trigger) for run in runs] == [
                (name, "succeeded", "exec")
            ]
        else:
            plain.add(name)

    fuzz(max_examples=4)(given(case=invocation())(check))()

    if plain:  # `locks --json` (in this process) lists each name as exec'd it
        listed = run_cli(backend_url, "--namespace", namespace, "locks", "--json")
        assert listed.status == 0, listed.stderr
        rows = json.loads(listed.stdout)
        assert sorted(row["name"] for row in rows) == sorted(plain)
        assert not any(row["held"] for row in rows)


@pytest.mark.parametrize("name", ["-x", "--backend=sqlite:///{tmp}/injected.db"])
def test_a_name_that_looks_like_an_option_is_refused_and_nothing_runs(
    namespace: str, tmp_path: Path, run_cli: RunCli, name: str
) -> None:
    store_file = tmp_path / "fleetcron.db"
    marker = tmp_path / "ran"
    argv = ("--namespace", namespace, "exec", name.format(tmp=tmp_path), "--", "touch", str(marker))
    result = run_cli(f"sqlite:///{store_file}", *argv)

    assert result.status == EXIT_USAGE, result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()
    assert not store_file.exists()
    assert not (tmp_path / "injected.db").exists()
