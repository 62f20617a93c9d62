"""``[queues.NAME]`` tables of a jobs file: what they hold, and every mistake refused with a
one-line message naming the file, the queue and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.jobsfile import load_jobs_file

HANDLER = "def handle(item):\n    pass\n"


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "workers_mod.py").write_text(HANDLER)
    path = tmp_path / "jobs.toml"
    path.write_text(text, "utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_jobs_file(path)
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


def test_a_queues_only_file_loads_its_workers_with_their_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[queues.invoices]\ncall = "workers_mod:handle"\nbatch = 50\nworkers = 3\n'
        'visibility = "2m"\nretry_backoff = "5s"\nretry_backoff_max = "10m"\n'
        'idle = "250ms"\n\n[queues.mail]\ncall = "workers_mod:handle"\n',
    )

    loaded = load_jobs_file(path)

    assert loaded.jobs == ()
    invoices, mail = loaded.queues
    assert (invoices.name, invoices.reference, invoices.batch, invoices.workers) == (
        "invoices",
        "workers_mod:handle",
        50,
        3,
    )
    assert invoices.idle_us == 250_000
    settings = invoices.settings
    assert settings.visibility_us == 120_000_000
    assert (settings.retry_backoff_us, settings.retry_backoff_max_us) == (5_000_000, 600_000_000)
    assert callable(invoices.handler)
    assert (mail.batch, mail.workers, mail.settings.visibility_us) == (10, 1, 300_000_000)


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ('call = "workers_mod:handle"\nbtach = 5\n', "queue 'q': key 'btach': unknown key"),
        ("batch = 5\n", "queue 'q': key 'call': a 'module:function' handler is required"),
        ('call = "nowhere:handle"\n', "queue 'q': key 'call': cannot import module 'nowhere'"),
        ('call = "workers_mod:nothing"\n', "key 'call': module 'workers_mod' has no attribute"),
        ('call = "workers_mod:handle"\nbatch = 0\n', "key 'batch': must be 1 to 10000, got 0"),
        ('call = "workers_mod:handle"\nbatch = "5"\n', "key 'batch': must be an integer"),
        ('call = "workers_mod:handle"\nworkers = 0\n', "key 'workers': must be 1 to 64"),
        ('call = "workers_mod:handle"\nvisibility = 30\n', "key 'visibility': 30 is not a"),
        ('call = "workers_mod:handle"\nvisibility = "0s"\n', "visibility must be longer than 0"),
        ('call = "workers_mod:handle"\nidle = "soon"\n', "key 'idle': 'soon' is not a duration"),
        ('call = "workers_mod:handle"\nmax_attempts = 3\n', "key 'max_attempts': unknown key"),
        (
            'call = "workers_mod:handle"\nretry_backoff = "2h"\n',
            "retry_backoff_max (1h) is shorter than retry_backoff (2h)",
        ),
    ],
)
def test_a_bad_queue_table_is_refused(tmp_path: Path, table: str, fragment: str) -> None:
    message = load_error(write(tmp_path, f"[queues.q]\n{table}"))
    assert fragment in message


def test_queues_must_be_tables_with_good_names(tmp_path: Path) -> None:
    assert "must be [queues.NAME] tables" in load_error(write(tmp_path, 'queues = "x"\n'))
    assert "queue 'q': must be a table" in load_error(write(tmp_path, "[queues]\nq = 5\n"))
    bad_name = '[queues." q"]\ncall = "workers_mod:handle"\n'
    assert "starts or ends with whitespace" in load_error(write(tmp_path, bad_name))
