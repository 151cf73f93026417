"""The guest's accounts (``guest/users.py``) against files in a temp dir: the default
account made on first use, group membership, ids the sandbox does not map, hostile
account files (links, fifos, huge), and the name rule shared with the host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_sandbox.core import validate
from agent_sandbox.guest import users
from agent_sandbox.guest.errors import GuestError


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                "app:x:1500:1500::/srv/app:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\napp:x:1500:\ndocker:x:999:app,other\n")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "home").mkdir()
    for name, value in (("PASSWD", etc / "passwd"), ("GROUP", etc / "group"),
                        ("SHADOW", etc / "shadow"), ("WORKSPACE", tmp_path / "workspace"),
                        ("HOMES", tmp_path / "home")):
        monkeypatch.setattr(users, name, str(value))
    for name in ("UID_MAP", "GID_MAP"):
        path = tmp_path / name.lower()
        path.write_text("         0     100000      65536\n")
        monkeypatch.setattr(users, name, str(path))
    monkeypatch.setattr(users, "_ready", {})
    return tmp_path


def test_the_name_rule_is_the_hosts() -> None:
    assert users.USER_NAME_PATTERN == validate.USER_NAME_PATTERN
    for good in ("user", "root", "_x", "a.b-c_1", "x" * 32):
        assert users.check_name(good) == good == validate.user(good)
    for bad in ("", "1a", "a:b", "a/b", "a b", "x" * 33, "a\n", 5):
        with pytest.raises(GuestError):
            users.check_name(bad)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the home to uid 1000 needs root")
def test_the_default_account_is_made_on_first_use(root: Path) -> None:
    account = users.lookup("user")
    assert (account.uid, account.gid, account.home) == (1000, 1000, f"{root}/home/user")
    passwd = (root / "etc" / "passwd").read_text()
    assert passwd.endswith(f"user:x:1000:1000::{root}/home/user:{account.shell}\n")
    assert "user:x:1000:\n" in (root / "etc" / "group").read_text()
    home = os.stat(root / "home" / "user")
    workspace = os.stat(root / "workspace")
    assert (home.st_uid, home.st_gid, workspace.st_uid) == (1000, 1000, 1000)
    users.lookup("user")
    lines = (root / "etc" / "passwd").read_text().splitlines()
    assert [line for line in lines if line.startswith("user:")] == [lines[-1]]  # made once


def test_groups_home_and_login_env(root: Path) -> None:
    app = users.lookup("app")
    assert (app.uid, app.gid, app.groups, app.home) == (1500, 1500, [999, 1500], "/srv/app")
    assert users.popen_kwargs(app) == {"user": 1500, "group": 1500, "extra_groups": [999, 1500]}
    env = users.login_env({"HOME": "/root", "PATH": "/bin"}, app)
    assert env == {"HOME": "/srv/app", "USER": "app", "LOGNAME": "app", "PATH": "/bin"}
    assert users.login_env({"A": "1"}, None) == {"A": "1"} and users.popen_kwargs(None) == {}


def test_unknown_unmapped_and_rootless_minimal(root: Path) -> None:
    with pytest.raises(GuestError, match="no user 'ghost'") as err:
        users.lookup("ghost")
    assert err.value.code == "not_found"
    (root / "uid_map").write_text("0 1000 1\n")  # a rootless sandbox with one id
    with pytest.raises(GuestError, match="uid 1500 of user 'app' is not mapped") as err:
        users.lookup("app")
    assert err.value.code == "wrong_state"
    (root / "etc" / "passwd").unlink()
    assert users.lookup("root").uid == 0  # a root filesystem without /etc/passwd


@pytest.mark.parametrize("kind", ["symlink", "fifo", "huge", "malformed"])
def test_hostile_account_files(root: Path, kind: str) -> None:
    passwd = root / "etc" / "passwd"
    passwd.unlink()
    if kind == "symlink":
        os.symlink("/etc/passwd", passwd)
    elif kind == "fifo":
        os.mkfifo(passwd)  # must not block the guest
    elif kind == "huge":
        passwd.write_bytes(b"x" * (users._MAX_DB + 10))
    else:
        passwd.write_text("app:x:notanumber:1:::\n")
    with pytest.raises(GuestError):
        users.lookup("app")
