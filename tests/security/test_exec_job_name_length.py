"""A job name's lease name must fit the store: ``exec --schedule`` with the longest name.

``fleetcron exec --schedule NAME`` serialises the job's runs on the job lease
``fleetcron:job:NAME``, 14 characters longer than the name. The MySQL lease table holds
names of at most 800 bytes (``VARBINARY(800)``: 200 four-byte characters), so a job name
of 197 or more four-byte characters (emoji, say) once made the claim fail with "Data too
long" and exit 70, after the job's definition was registered. A job name is now at most
``MAX_JOB_NAME_LENGTH`` (186) characters: a longer one is refused (exit 2, nothing
written), a name at the limit runs on every backend.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from e2e.helpers import Cli, assert_clean_error
from fleetcron.cli.exitcodes import EXIT_USAGE
from fleetcron.names import MAX_NAME_LENGTH
from fleetcron.stores import open_store, parse_store_url

WIDE_NAME = "🔒" * MAX_NAME_LENGTH  # a valid lock name: 200 characters, 800 bytes


@pytest.mark.parametrize("backend_url", ["sqlite", "mysql"], indirect=True)
def test_exec_schedule_with_a_maximum_length_name_of_wide_characters_runs_or_is_refused_cleanly(
    backend_url: str, namespace: str, make_cli: Callable[[str, str], Cli]
) -> None:
    result = make_cli(backend_url, namespace).run(
        "exec", WIDE_NAME, "--schedule", "* * * * *", "--", "true"
    )

    store = open_store(parse_store_url(backend_url))
    try:
        jobs = store.run(store.ops.job_list(namespace))
        runs = store.run(store.ops.run_list(namespace, WIDE_NAME, 10))
    finally:
        store.close()
    if result.returncode == 0:  # run as any other job
        assert [(run.job, run.state) for run in runs] == [(WIDE_NAME, "succeeded")]
    else:  # or refused as bad input: nothing registered, nothing run
        assert_clean_error(result, EXIT_USAGE, "job name")
        assert (jobs, runs) == ([], [])
