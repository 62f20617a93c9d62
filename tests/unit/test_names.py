from __future__ import annotations

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.names import MAX_NAME_LENGTH, validate_name, validate_namespace


@pytest.mark.parametrize(
    "name",
    ["report", "it's; DROP TABLE x; --", "naïve-☃-名前", "a" * MAX_NAME_LENGTH, 'quo"te', "a b"],
)
def test_names_that_stores_can_hold_are_accepted_unchanged(name: str) -> None:
    assert validate_name(name) == name


def test_names_are_normalised_to_nfc() -> None:
    assert validate_name("cafe\u0301") == "caf\u00e9"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("a" * (MAX_NAME_LENGTH + 1), "maximum"),
        ("nul\x00byte", "control character"),
        ("tab\there", "control character"),
        (" padded", "whitespace"),
        ("padded ", "whitespace"),
    ],
)
def test_names_a_store_cannot_hold_are_a_clear_error(name: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        validate_name(name)


def test_namespace_must_be_a_non_empty_string() -> None:
    with pytest.raises(ConfigurationError, match="namespace is empty"):
        validate_namespace("")
    with pytest.raises(ConfigurationError, match="must be a string"):
        validate_namespace(3)


def test_an_explicitly_empty_namespace_is_an_error_not_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetcron.names import resolve_namespace

    monkeypatch.delenv("FLEETCRON_NAMESPACE", raising=False)
    assert resolve_namespace(None) == "default"
    with pytest.raises(ConfigurationError, match="namespace is empty"):
        resolve_namespace("")
