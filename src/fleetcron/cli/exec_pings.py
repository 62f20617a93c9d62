"""``fleetcron exec --ping-url``: the run's start and end, reported to a monitor."""

from __future__ import annotations

from fleetcron.cli.exec_options import ExecOptions
from fleetcron.cli.exitcodes import EXIT_TIMEOUT
from fleetcron.models import RunOutcome
from fleetcron.pings import Pinger, finish_ping, start_ping

__all__ = ["RunPings"]


class RunPings:
    """``--ping-url``: the run's start and end, pinged in order from a background thread
    (no-ops without the option). :meth:`finish` waits for them up to
    :data:`~fleetcron.pings.CLOSE_WAIT_S`; they never change the exit status."""

    def __init__(self, options: ExecOptions, run_id: str) -> None:
        self.job = options.name
        self.url = options.ping_url
        self.run_id = run_id
        self._pinger = Pinger() if options.ping_url is not None else None

    def start(self) -> None:
        """Ping the run's start (``URL/start``)."""
        if self._pinger is not None and self.url is not None:
            self._pinger.send(start_ping(self.job, self.url, self.run_id))

    def finish(self, outcome: RunOutcome) -> None:
        """Ping the run's end as ``outcome`` says it ended, then wait for the pings to go
        out (at most :data:`~fleetcron.pings.CLOSE_WAIT_S`)."""
        if self._pinger is None or self.url is None:
            return
        # A command stopped by fleetcron (timeout 124, lease lost 76, cancelled) is a
        # /fail: the status is fleetcron's, not the command's.
        own = outcome.state == "failed" and outcome.exit_code != EXIT_TIMEOUT
        ping = finish_ping(
            self.job,
            self.url,
            self.run_id,
            outcome,
            exit_status=outcome.exit_code if own else None,
        )
        self._pinger.send(ping)
        self._pinger.close()
