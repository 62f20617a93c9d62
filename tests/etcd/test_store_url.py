"""What an ``etcd://`` URL may say: members, a key prefix and the timeouts, nothing else."""

from __future__ import annotations

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.stores import parse_store_url
from fleetcron.stores.etcd.messages import Endpoint
from fleetcron.stores.etcd.store import DEFAULT_PREFIX, _client_args


def test_members_prefix_and_timeouts_are_read_from_the_url() -> None:
    url = parse_store_url("etcd://10.0.0.1:2379,10.0.0.2,10.0.0.3:2381/app/jobs?timeout=3")

    endpoints, prefix = _client_args(url)

    assert endpoints == (
        Endpoint("10.0.0.1", 2379),
        Endpoint("10.0.0.2", 2379),
        Endpoint("10.0.0.3", 2381),
    )
    assert prefix == "app/jobs"
    assert url.kind == "etcd"
    assert url.timeout_s == 3


def test_a_url_without_a_path_keeps_its_keys_under_the_default_prefix() -> None:
    assert _client_args(parse_store_url("etcd://h1:2379"))[1] == DEFAULT_PREFIX


def test_etcds_speaks_tls_to_every_member_written_without_a_scheme() -> None:
    endpoints, _ = _client_args(parse_store_url("etcds://h1:2379,h2:2379"))

    assert all(endpoint.tls for endpoint in endpoints)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("etcd://h1:2379/app?lease=5", "lease"),
        ("etcd://user:secret@h1:2379/app", "authentication"),
        ("etcd://h1:99999/app", "65535"),
    ],
)
def test_what_the_backend_cannot_honour_is_refused_naming_it(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named) as refused:
        _client_args(parse_store_url(url))

    assert "secret" not in str(refused.value)
