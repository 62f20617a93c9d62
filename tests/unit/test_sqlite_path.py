"""check_sqlite_path refuses network filesystems, read from a (fake) mountinfo file."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.stores import open_existing_store, open_store, parse_store_url
from fleetcron.stores.sql.sqlite import check_sqlite_path, filesystem_type


def _mountinfo(tmp_path: Path, *mounts: tuple[str, str]) -> Path:
    lines = ["22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"]
    for index, (point, fs_type) in enumerate(mounts):
        escaped = point.replace(" ", "\\040")
        lines.append(f"{90 + index} 22 0:{50 + index} / {escaped} rw - {fs_type} src:/x rw")
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fs_type", ["nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "9p", "ceph"])
def test_a_database_on_a_network_filesystem_is_refused(tmp_path: Path, fs_type: str) -> None:
    share = tmp_path / "share"
    share.mkdir()
    mountinfo = _mountinfo(tmp_path, (str(share), fs_type))
    with pytest.raises(ConfigurationError, match=rf"network filesystem \({fs_type}\)"):
        check_sqlite_path(share / "fc.db", create_parent=False, mountinfo=mountinfo)
    assert list(share.iterdir()) == []


def test_the_longest_mount_point_decides(tmp_path: Path) -> None:
    share = tmp_path / "share"
    local = share / "local"
    local.mkdir(parents=True)
    mountinfo = _mountinfo(tmp_path, (str(share), "nfs4"), (str(local), "ext4"))
    assert filesystem_type(local, mountinfo) == "ext4"
    assert filesystem_type(share, mountinfo) == "nfs4"
    path = check_sqlite_path(local / "fc.db", create_parent=False, mountinfo=mountinfo)
    assert path == local / "fc.db"


def test_a_mount_point_with_a_space_is_matched(tmp_path: Path) -> None:
    share = tmp_path / "my share"
    share.mkdir()
    mountinfo = _mountinfo(tmp_path, (str(share), "nfs"))
    assert filesystem_type(share, mountinfo) == "nfs"


def test_a_sibling_with_a_common_prefix_is_not_inside_the_mount(tmp_path: Path) -> None:
    (tmp_path / "share").mkdir()
    sibling = tmp_path / "share2"
    sibling.mkdir()
    mountinfo = _mountinfo(tmp_path, (str(tmp_path / "share"), "nfs"))
    assert filesystem_type(sibling, mountinfo) == "ext4"
    check_sqlite_path(sibling / "fc.db", create_parent=False, mountinfo=mountinfo)


def test_an_unreadable_mountinfo_does_not_refuse(tmp_path: Path) -> None:
    missing = tmp_path / "no-mountinfo"
    assert filesystem_type(tmp_path, missing) is None
    check_sqlite_path(tmp_path / "fc.db", create_parent=False, mountinfo=missing)


def test_a_network_filesystem_is_refused_before_any_directory_is_created(tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"36 25 0:32 / / rw,relatime - ext4 /dev/vda rw\n"
        f"99 36 0:77 / {share} rw,relatime - nfs4 server:/export rw\n"
    )
    target = share / "state" / "fleetcron" / "fc.db"

    with pytest.raises(ConfigurationError, match="network filesystem"):
        check_sqlite_path(target, create_parent=True, mountinfo=mountinfo)
    assert not (share / "state").exists()


def test_a_three_slash_url_whose_directory_exists_only_from_the_root_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Run from `work`, where tmp/… does not exist; /tmp/… does.
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    relative = f"{str(tmp_path).lstrip('/')}/x.db"  # e.g. tmp/pytest-of-u/…/x.db
    url = parse_store_url(f"sqlite:///{relative}")
    expected = (
        f"backend URL 'sqlite:///{relative}' names {relative} relative to the working "
        f"directory {work}, whose directory {Path(relative).parent} does not exist; for the "
        f"absolute path {tmp_path / 'x.db'} write 'sqlite:///{tmp_path / 'x.db'}'"
    )
    for opening in (open_store, open_existing_store):
        with pytest.raises(ConfigurationError) as raised:
            opening(url)
        assert raised.value.message == expected
    assert list(work.iterdir()) == []
    assert not (tmp_path / "x.db").exists()
    # Where the directory is there from the working directory, the URL names that file.
    (work / Path(relative).parent).mkdir(parents=True)
    open_store(url).close()
    assert (work / relative).is_file()
    assert not (tmp_path / "x.db").exists()
