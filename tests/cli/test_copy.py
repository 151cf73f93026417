"""``abx sandbox upload|download`` with files, directories and ``.``, as ``cp -r`` and
``docker cp`` do it; every wrong destination a clear message, never a traceback."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sid() -> Iterator[str]:
    """One sandbox for the module; the CLI finds it on this host's engine (the session's
    data dir). No ``from conftest import``: the name is taken when tests/server runs too."""
    sandbox = Sandbox.create()
    yield sandbox.sandbox_id
    sandbox.kill(delete_volume=True)


def _clean(r: Any) -> Any:
    assert "Traceback" not in r.err, r.err
    return r


def _proj(root: Path) -> Path:
    proj = root / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "main.py").write_text("print('hi')\n")
    (proj / "data.csv").write_text("a,b\n1,2\n")
    os.symlink("src/main.py", proj / "link.py")
    return proj


def test_directories_go_in_and_out(abx: Any, sid: str) -> None:
    _proj(abx.cwd)
    # Today: "proj is not a file". An existing directory receives it under its name.
    r = _clean(abx("sandbox", "upload", sid, "proj", "/workspace/"))
    assert f"uploaded 2 files, 1 directory, 1 symlink (20 bytes) to {sid}:/workspace/proj" \
        in r.out
    ls = abx("sandbox", "exec", sid, "cd /workspace/proj && cat src/main.py && readlink "
             "link.py").out
    assert ls == "print('hi')\nsrc/main.py\n"
    # A new destination is the copy; `dir/.` copies the contents; relative = /workspace.
    _clean(abx("sandbox", "upload", sid, "proj", "/workspace/copy2"))
    _clean(abx("sandbox", "upload", sid, "proj/.", "flat"))
    listing = abx("sandbox", "exec", sid, "ls /workspace/copy2 /workspace/flat").out
    assert listing.count("data.csv") == 2 and "proj" not in listing
    # Out: into `.` (today: a traceback), into a new directory, contents only.
    (abx.cwd / "proj").rename(abx.cwd / "orig")
    _clean(abx("sandbox", "download", sid, "/workspace/proj", "."))
    assert (abx.cwd / "proj" / "src" / "main.py").read_text() == "print('hi')\n"
    assert os.readlink(abx.cwd / "proj" / "link.py") == "src/main.py"
    _clean(abx("sandbox", "download", sid, "proj", "fresh"))
    assert (abx.cwd / "fresh" / "data.csv").exists()
    (abx.cwd / "into").mkdir()
    _clean(abx("sandbox", "download", sid, "/workspace/proj/.", "into"))
    assert sorted(os.listdir(abx.cwd / "into")) == ["data.csv", "link.py", "src"]
    out = abx("sandbox", "download", sid, "/workspace/proj", "j", "--json").json()
    assert out["files"] == 2 and out["symlinks"] == 1 and out["skipped"] == []


def test_files_go_where_cp_puts_them(abx: Any, sid: str) -> None:
    abx("sandbox", "exec", sid, "printf 'x,y\\n' > /workspace/data.csv")
    # Today: "PosixPath('.') has an empty name".
    r = _clean(abx("sandbox", "download", sid, "/workspace/data.csv", "."))
    assert "downloaded 4 bytes to ./data.csv" in r.out
    assert (abx.cwd / "data.csv").read_text() == "x,y\n"
    (abx.cwd / "dir").mkdir()
    _clean(abx("sandbox", "download", sid, "data.csv", "dir"))  # an existing directory
    assert (abx.cwd / "dir" / "data.csv").read_text() == "x,y\n"
    _clean(abx("sandbox", "download", sid, "data.csv", "renamed.csv"))
    assert (abx.cwd / "renamed.csv").read_text() == "x,y\n"
    assert _clean(abx("sandbox", "download", sid, "data.csv", "-")).out == "x,y\n"
    (abx.cwd / "up.txt").write_text("up")
    _clean(abx("sandbox", "upload", sid, "up.txt", "."))  # into /workspace
    _clean(abx("sandbox", "upload", sid, "up.txt", "/workspace/sub/new.txt"))
    got = abx("sandbox", "exec", sid, "cat /workspace/up.txt /workspace/sub/new.txt").out
    assert got == "upup"
    info = json.loads(abx("sandbox", "upload", sid, "up.txt", "/tmp/", "--json").out)
    assert info == {"path": "/tmp/up.txt", "size": 2}


def test_upload_as_a_user(abx: Any, sid: str) -> None:
    """--user: what is uploaded, file or directory, belongs to that account (its commands
    can change it); without it, root's."""
    _proj(abx.cwd)
    (abx.cwd / "one.txt").write_text("1")
    _clean(abx("sandbox", "upload", sid, "proj", "/workspace/u/proj", "--user", "user"))
    _clean(abx("sandbox", "upload", sid, "one.txt", "/workspace/u/one.txt", "-u", "user"))
    _clean(abx("sandbox", "upload", sid, "one.txt", "/workspace/rootfile"))
    edit = Sandbox.connect(sid).commands.run(
        "echo 2 >> /workspace/u/one.txt && echo x >> /workspace/u/proj/src/main.py", user="user")
    assert edit.exit_code == 0, edit.stderr
    owners = abx("sandbox", "exec", sid, "stat -c %U /workspace/u /workspace/u/proj/src "
                 "/workspace/u/proj/src/main.py /workspace/u/one.txt /workspace/rootfile").out
    assert owners.split() == ["user"] * 4 + ["root"]
    r = _clean(abx("sandbox", "upload", sid, "one.txt", "/workspace/x", "--user", "no body",
                   check=2))
    assert "user must be an account name" in r.err


@pytest.mark.parametrize(("args", "code", "message"), [
    # Today: a traceback (FileNotFoundError) for the missing parent.
    (["download", "{sid}", "/workspace/data.csv", "no/such/dir/x.csv"], 2,
     "does not exist (make it first"),
    (["download", "{sid}", "/workspace/data.csv", "nodir/"], 2, "is not a directory"),
    (["download", "{sid}", "/workspace/missing", "."], 1, "no such file or directory"),
    (["download", "{sid}", "/workspace", "-"], 2, "is a directory; give a local"),
    (["download", "{sid}", "/workspace/data.csv/", "."], 2, "is not a directory"),
    (["upload", "{sid}", "missing.txt", "/workspace/x"], 2, "no such file or directory"),
    (["upload", "{sid}", "adir", "/workspace/data.csv"], 2, "onto the file"),
    (["upload", "{sid}", "afile", "/workspace/nodir/"], 2, "is not a directory"),
    (["download", "{sid}", "/workspace", "afile"], 2, "onto the file"),
])
def test_wrong_destinations_say_what_to_do(abx: Any, sid: str, args: list[str], code: int,
                                           message: str) -> None:
    abx("sandbox", "exec", sid, "printf 1 > /workspace/data.csv")
    (abx.cwd / "adir").mkdir()
    (abx.cwd / "afile").write_text("f")
    r = _clean(abx("sandbox", *[a.format(sid=sid) for a in args], check=code))
    assert message in r.err and r.err.startswith("error: ")


def test_what_a_sandbox_planted_is_reported_safely(abx: Any, sid: str) -> None:
    abx("sandbox", "exec", sid, "mkdir -p /workspace/evil && cd /workspace/evil && "
        "ln -sf /etc escape && printf x > \"$(printf 'bad\\033]0;pwned\\007')\" && "
        "ln -sf /etc \"$(printf 'esc\\033[2J')\"")
    r = _clean(abx("sandbox", "download", sid, "/workspace/evil", "out"))
    assert "warning: escape: a symlink to /etc, outside the directory; skipped" in r.err
    assert "\x1b" not in r.err + r.out and "esc\\x1b[2J" in r.err
    assert (abx.cwd / "out" / "bad\x1b]0;pwned\x07").read_text() == "x"


def test_a_conditional_upload(abx: Any, sid: str) -> None:
    """Issue 29: download shows the file's version; upload --if-match writes only at it."""
    abx("sandbox", "exec", sid, "printf 1 > /workspace/n.txt")
    got = _clean(abx("sandbox", "download", sid, "n.txt", "n.txt", "--json")).json()
    version = got["version"]
    assert version and "(version " in _clean(abx("sandbox", "download", sid, "n.txt",
                                                  "again.txt")).out
    (abx.cwd / "n.txt").write_text("2")
    _clean(abx("sandbox", "upload", sid, "n.txt", "n.txt", "--if-match", version))
    stale = _clean(abx("sandbox", "upload", sid, "n.txt", "n.txt", "--if-match", version,
                       check=None))
    assert stale.code != 0 and "has changed since that version" in stale.err, stale
    (abx.cwd / "proj").mkdir()
    r = _clean(abx("sandbox", "upload", sid, "proj", "x", "--if-match", version, check=None))
    assert r.code == 2
