from __future__ import annotations

import types

import fleetcron
import fleetcron.errors


def test_public_names_are_exactly_the_declared_ones() -> None:
    # Submodules appear on the package once imported; everything else that is public must
    # be declared in __all__, and everything declared must exist.
    exported = {
        name
        for name, value in vars(fleetcron).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert exported - {"annotations"} == set(fleetcron.__all__) - {"__version__"}
    assert all(hasattr(fleetcron, name) for name in fleetcron.__all__)


def test_every_error_derives_from_the_one_root() -> None:
    for name in fleetcron.errors.__all__:
        error = getattr(fleetcron.errors, name)
        assert issubclass(error, fleetcron.FleetcronError)
        assert not issubclass(error, ValueError | KeyError | OSError)


def test_contention_errors_carry_the_lock_name() -> None:
    busy = fleetcron.LockBusy("report", holder="web-1:42")
    assert busy.name == "report"
    assert busy.holder == "web-1:42"
    assert "report" in str(busy)
    lost = fleetcron.LeaseLost("report", fence=7)
    assert (lost.name, lost.fence) == ("report", 7)
