"""A holder as it is shown: never its secret token."""

from __future__ import annotations

from fleetcron.lease import new_holder
from fleetcron.models import display_holder


def test_a_holder_is_shown_as_host_and_pid_without_its_token() -> None:
    holder = new_holder()
    host, pid, token = holder.split(":")
    assert display_holder(holder) == f"{host}:{pid}"
    # The leader lease's holder carries a suffix after the token: still host:pid only.
    assert display_holder(f"{holder}:leader") == f"{host}:{pid}"
    assert token not in display_holder(f"{holder}:leader")
    # A host that holds colons (an IPv6 address) keeps them.
    assert display_holder(f"::1:{pid}:{token}:leader") == f"::1:{pid}"
