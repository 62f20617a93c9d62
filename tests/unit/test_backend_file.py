"""The backend URL read from a file (``--backend-file``, ``$FLEETCRON_BACKEND_FILE``), its
place in the precedence, and the warning about a password on the command line."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.stores import _warn_if_on_command_line, read_backend_file, resolve_backend
from fleetcron.stores.url import parse_store_url

PASSWORD = "S3cretPassw0rd"
URL = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test"


def _file(path: Path, content: str | bytes, mode: int = 0o600) -> Path:
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    path.chmod(mode)
    return path


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and getattr(r, "action", None) == "store_warning"
    ]


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No backend from the test's own environment."""
    monkeypatch.delenv("FLEETCRON_BACKEND", raising=False)
    monkeypatch.delenv("FLEETCRON_BACKEND_FILE", raising=False)
    return monkeypatch


# -- reading the file ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "content",
    [f"{URL}\n", f"  {URL}  \n", f"{URL}\nsecond line ignored\n", f"\ufeff{URL}\r\n", URL],
    ids=["line", "padded", "more-lines", "bom-crlf", "no-newline"],
)
def test_the_file_holds_the_url_on_its_first_line(tmp_path: Path, content: str) -> None:
    assert read_backend_file(str(_file(tmp_path / "url", content)), source="test") == URL


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo")  # nobody writes: reading it must not wait
    return tmp_path / "fifo"


BAD_FILES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("missing", lambda d: d / "missing", "does not exist"),
    ("directory", lambda d: d, "is not a regular file: it is a directory"),
    ("fifo", _fifo, "is not a regular file: it is a FIFO"),
    ("device", lambda d: Path("/dev/null"), "is not a regular file: it is a character device"),
    ("empty", lambda d: _file(d / "f", ""), "is empty"),
    ("blank", lambda d: _file(d / "f", " \n\t\n"), "is empty"),
    ("first-line-blank", lambda d: _file(d / "f", f"\n{URL}\n"), "the first line is empty"),
    ("too-large", lambda d: _file(d / "f", URL + " " * 65_536), "larger than 64 KiB"),
    ("not-utf8", lambda d: _file(d / "f", b"postgresql://\xff\xfe@h/x"), "is not UTF-8 text"),
    ("bare-password", lambda d: _file(d / "f", PASSWORD), "the first line is not a backend URL"),
    (
        "bad-url",
        lambda d: _file(d / "f", f"postgresql://postgres:{PASSWORD}@h:99999/x"),
        "the port must be a number from 1 to 65535",
    ),
]


@pytest.mark.parametrize(
    ("make", "problem"),
    [(make, problem) for _, make, problem in BAD_FILES],
    ids=[i[0] for i in BAD_FILES],
)
def test_a_bad_backend_file_is_refused_naming_its_path_never_its_secret(
    tmp_path: Path, make: Callable[[Path], Path], problem: str
) -> None:
    path = str(make(tmp_path))
    with pytest.raises(ConfigurationError) as raised:
        read_backend_file(path, source="--backend-file")
    message = raised.value.message
    assert problem in message
    assert f"backend file {path!r} (from --backend-file)" in message
    assert PASSWORD not in message


def test_an_unreadable_backend_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path / "url", URL)

    def denied(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)  # (root reads a file of mode 000 all the same)
    with pytest.raises(ConfigurationError, match=r"'.*url' \(from x\) cannot be read: Permission"):
        read_backend_file(str(path), source="x")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_backend_file_other_users_can_read_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    path = _file(tmp_path / "url", URL, mode)
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        assert read_backend_file(str(path), source="--backend-file") == URL
    (warning,) = _warnings(caplog)
    assert f"{str(path)!r}" in warning
    assert f"mode {mode:04o}" in warning
    assert PASSWORD not in warning


def test_a_private_backend_file_gives_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="fleetcron"):
        read_backend_file(str(_file(tmp_path / "url", URL, 0o400)), source="x")
    assert caplog.records == []


# -- precedence ---------------------------------------------------------------------------
def test_the_backend_file_variable_comes_after_fleetcron_backend_and_before_the_jobs_file(
    tmp_path: Path, environ: pytest.MonkeyPatch
) -> None:
    from_file = f"sqlite:///{tmp_path / 'file.db'}"
    environ.setenv("FLEETCRON_BACKEND_FILE", str(_file(tmp_path / "url", from_file)))
    assert resolve_backend(None, "memory://").raw == from_file  # over the jobs file
    assert resolve_backend("redis://cache/0", "memory://").raw == "redis://cache/0"
    environ.setenv("FLEETCRON_BACKEND", "memory://")
    assert resolve_backend(None, "redis://cache/0").raw == "memory://"


def test_a_backend_file_that_is_not_used_is_not_read(
    tmp_path: Path, environ: pytest.MonkeyPatch
) -> None:
    environ.setenv("FLEETCRON_BACKEND_FILE", str(tmp_path / "missing"))
    environ.setenv("FLEETCRON_BACKEND", "memory://")
    assert resolve_backend().kind == "memory"


def test_a_bad_backend_file_variable_is_refused_naming_it(
    tmp_path: Path, environ: pytest.MonkeyPatch
) -> None:
    environ.setenv("FLEETCRON_BACKEND_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match=r"from \$FLEETCRON_BACKEND_FILE\) does not"):
        resolve_backend(None, "memory://")


def test_an_empty_backend_file_variable_is_unset(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("FLEETCRON_BACKEND_FILE", "")
    assert resolve_backend(None, "memory://").kind == "memory"


# -- a password on the command line -----------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["fleetcron", "--backend", URL, "locks"],
        ["fleetcron", f"--backend={URL}", "locks"],
        ["app.py", f"--db= {URL} "],
    ],
)
def test_a_url_with_a_password_on_the_command_line_is_warned_about(
    caplog: pytest.LogCaptureFixture, argv: list[str]
) -> None:
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        _warn_if_on_command_line(parse_store_url(URL), argv)
    (warning,) = _warnings(caplog)
    assert "$FLEETCRON_BACKEND" in warning
    assert "--backend-file" in warning
    assert "postgresql://postgres:***@127.0.0.1:5432/test" in warning
    assert PASSWORD not in warning


def test_a_password_in_the_query_on_the_command_line_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"postgresql://postgres@127.0.0.1:5432/test?password={PASSWORD}"
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        _warn_if_on_command_line(parse_store_url(url), ["fleetcron", "--backend", url])
    (warning,) = _warnings(caplog)
    assert PASSWORD not in warning


@pytest.mark.parametrize(
    ("url", "argv"),
    [
        (URL, ["fleetcron", "--backend-file", "/run/secrets/url", "locks"]),  # not on it
        (
            "postgresql://postgres@127.0.0.1:5432/test",
            ["fleetcron", "--backend", "postgresql://postgres@127.0.0.1:5432/test"],
        ),
        ("redis://127.0.0.1:6379/0", ["fleetcron", "--backend", "redis://127.0.0.1:6379/0"]),
    ],
)
def test_no_warning_without_a_password_on_the_command_line(
    caplog: pytest.LogCaptureFixture, url: str, argv: list[str]
) -> None:
    with caplog.at_level(logging.DEBUG, logger="fleetcron"):
        _warn_if_on_command_line(parse_store_url(url), argv)
    assert caplog.records == []
