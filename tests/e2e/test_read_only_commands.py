"""Commands that only read a store, on a mistyped store or namespace: one ``fleetcron:``
line and a non-zero exit — never an answer read from an empty store made for the occasion.

``status --check`` with no job to judge fails (exit 2, as for a job the store does not
know).
"""

from __future__ import annotations

from e2e.helpers import CROSS_PROCESS_BACKENDS, Cli, assert_clean_error
from fleetcron.cli.exitcodes import EXIT_USAGE


@CROSS_PROCESS_BACKENDS
def test_status_check_fails_on_a_namespace_with_no_job_to_judge(cli: Cli) -> None:
    assert cli.run("exec", "beat", "--schedule", "* * * * *", "--", "true").returncode == 0
    assert cli.run("status", "--check").returncode == 0
    typo = Cli(cli.backend, cli.namespace[:-1], cli.workdir)  # one character short

    for argv, fragment in [
        (("status", "--check"), f"no jobs in namespace {typo.namespace!r} for --check to judge"),
        (("status",), f"namespace {typo.namespace!r} holds nothing"),
        (("status", "--json"), f"namespace {typo.namespace!r} holds nothing"),
        (("status", "--check", "beat"), f"no job named beat in namespace {typo.namespace!r}"),
    ]:
        result = typo.run(*argv)
        assert_clean_error(result, EXIT_USAGE, fragment, f"did you mean {cli.namespace!r}")
        assert result.stdout == ""
