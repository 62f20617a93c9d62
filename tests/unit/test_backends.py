"""The backends are found by URL scheme in one table, and nothing outside the stores names
a concrete one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.backends import BACKENDS, Backend, backend, entry_points, schemes
from fleetcron.stores.url import SCHEMES

SRC = Path(__file__).resolve().parents[2] / "src" / "fleetcron"


def test_every_scheme_names_one_backend_and_every_backend_has_its_entry_points() -> None:
    assert SCHEMES == schemes()
    assert {entry.kind for entry in BACKENDS} == set(SCHEMES.values())
    for entry in BACKENDS:
        module = entry_points(entry)
        assert callable(module.open_sync), entry.kind
        assert backend(entry.kind) is entry


def test_a_backend_whose_driver_is_missing_says_which_extra_installs_it() -> None:
    missing = Backend("nosuch", ("nosuch",), "fleetcron_no_such_driver_module", "nosuch")

    with pytest.raises(ConfigurationError, match=r"pip install 'fleetcron\[nosuch\]'"):
        entry_points(missing)


def test_a_store_is_opened_through_its_backends_entry_point(tmp_path: Path) -> None:
    store = open_store(parse_store_url(f"sqlite:///{tmp_path / 'x.db'}"))
    try:
        assert type(store).__module__ == backend("sqlite").module
    finally:
        store.close()


def test_nothing_outside_the_stores_imports_a_concrete_backend() -> None:
    concrete = ("fleetcron.stores.sql", "fleetcron.stores.redis", "fleetcron.stores.memory")
    allowed = {SRC / "testing.py"}  # MemoryStore for users' tests, by design
    found = []
    for path in SRC.rglob("*.py"):
        if path.is_relative_to(SRC / "stores") or path in allowed:
            continue
        found += [
            f"{path.relative_to(SRC)}: {node.module}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(concrete)
        ]
    assert found == []
