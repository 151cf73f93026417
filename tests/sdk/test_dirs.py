"""files.upload_dir / download_dir on real sandboxes (embedded engine and gateway): a
faithful round trip, and what a sandbox can plant (links out, device files, endless
sparse files, names full of control characters) never reaching outside the target."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import tarfile
from pathlib import Path

import pytest

from agent_sandbox import AsyncSandbox, Sandbox
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError

pytestmark = pytest.mark.integration


def _tree(root: Path) -> dict[str, tuple[str, object, int]]:
    out: dict[str, tuple[str, object, int]] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            rel = str(path.relative_to(root))
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                out[rel] = ("link", os.readlink(path), 0)
            elif stat.S_ISDIR(mode):
                out[rel] = ("dir", None, stat.S_IMODE(mode))
            elif stat.S_ISREG(mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", digest, stat.S_IMODE(mode))
            else:
                out[rel] = ("other", None, 0)
    return out


def _local_tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (root / "data.bin").write_bytes(os.urandom(3 << 20))
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "run.sh").chmod(0o750)
    os.symlink("src/pkg/mod.py", root / "main.py")
    os.symlink("/usr/bin/python3", root / "python")  # out of the tree: kept on upload


def test_round_trip(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    _local_tree(src)
    up = sandbox.files.upload_dir(src, "/workspace/proj")
    assert (up.files, up.dirs, up.symlinks, up.skipped) == (3, 3, 2, [])
    assert up.size == (3 << 20) + len("print('hi')\n") + len("#!/bin/sh\necho ran\n")
    r = sandbox.commands.run("cd /workspace/proj && ./run.sh && readlink python main.py && "
                             "python3 main.py && stat -c %a run.sh && "
                             "sha256sum data.bin | cut -c1-64")
    assert r.stdout.split("\n")[:6] == ["ran", "/usr/bin/python3", "src/pkg/mod.py", "hi",
                                        "750", _tree(src)["data.bin"][1]]

    back = tmp_path / "back"
    down = sandbox.files.download_dir("/workspace/proj", back)
    assert down.skipped == ["python: a symlink to /usr/bin/python3, outside the directory; "
                            "skipped"]
    want = _tree(src)
    del want["python"]
    assert _tree(back) == want
    down = sandbox.files.download_dir("/workspace/proj", tmp_path / "all", outside_links=True)
    assert _tree(tmp_path / "all") == _tree(src) and down.skipped == []
    # Into an existing directory: files replaced, others left alone.
    (back / "mine.txt").write_text("mine")
    sandbox.files.write("/workspace/proj/data.bin", b"new")
    sandbox.files.download_dir("/workspace/proj", back)
    assert (back / "data.bin").read_bytes() == b"new" and (back / "mine.txt").exists()


def test_download_keeps_what_the_sandbox_planted_inside(sandbox: Sandbox,
                                                        tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "passwd").write_text("root")
    sandbox.commands.run(
        "set -e; mkdir -p /workspace/t/d /workspace/t/planted; cd /workspace/t; "
        "ln -s /etc escape; ln -s ../../.. up; ln -s .. d/up; ln -s d/up/.. chain; "
        "echo x > suid; chmod 4755 suid; mkfifo fifo; printf y > \"$(printf 'ctl\\033[2J')\"; "
        "echo mine > planted/x; echo over > file", timeout=30)
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(victim, dst / "planted")
    os.symlink(victim / "passwd", dst / "file")
    result = sandbox.files.download_dir("/workspace/t", dst)
    assert _tree(victim) == {"passwd": ("file", hashlib.sha256(b"root").hexdigest(), 0o644)}
    assert (dst / "file").read_text() == "over\n" and not (dst / "file").is_symlink()
    assert (dst / "suid").stat().st_mode & 0o7777 == 0o755
    assert os.readlink(dst / "d" / "up") == ".." and os.readlink(dst / "chain") == "d/up/.."
    assert (dst / "ctl\x1b[2J").read_text() == "y"
    notes = "\n".join(result.skipped)
    assert "escape: a symlink to /etc, outside" in notes and "up: a symlink to ../../.." in notes
    assert "planted: a symlink of that name is in the way" in notes
    assert "planted/x: goes through the symlink planted" in notes
    assert "fifo: a fifo; skipped" in notes
    assert "\x1b" not in notes  # a sandbox's names never reach a terminal raw


def test_a_download_stays_on_one_file_system(sandbox: Sandbox, tmp_path: Path) -> None:
    result = sandbox.files.download_dir("/dev", tmp_path / "dev")
    notes = "\n".join(result.skipped)
    assert "shm: another file system (a mount point); skipped" in notes
    assert "pts: another file system" in notes and "null: a character device" in notes
    assert not (tmp_path / "dev" / "shm").exists()


def test_an_endless_sparse_file_stops_at_max_bytes(sandbox: Sandbox, tmp_path: Path) -> None:
    sandbox.commands.run("mkdir -p /workspace/s && truncate -s 100G /workspace/s/sparse")
    with pytest.raises(InvalidArgumentError, match="larger than max_bytes=33554432"):
        sandbox.files.download_dir("/workspace/s", tmp_path / "s", max_bytes=32 << 20)
    assert os.listdir(tmp_path / "s") == []  # the part-written file removed


def test_upload_never_goes_through_links_planted_in_the_sandbox(sandbox: Sandbox,
                                                                tmp_path: Path) -> None:
    before = sandbox.commands.run("sha256sum /etc/passwd").stdout
    sandbox.commands.run("mkdir -p /workspace/up && ln -s /etc /workspace/up/conf && "
                         "ln -s /etc/passwd /workspace/up/users")
    src = tmp_path / "src"
    (src / "conf").mkdir(parents=True)
    (src / "conf" / "passwd").write_text("owned\n")
    (src / "users").write_text("replaced\n")
    result = sandbox.files.upload_dir(src, "/workspace/up")
    assert "conf: a symlink of that name is in the way; skipped" in result.skipped
    assert "conf/passwd: goes through the symlink conf; skipped" in result.skipped
    assert sandbox.commands.run("sha256sum /etc/passwd").stdout == before
    assert sandbox.files.stat("/workspace/up/users").type == "file"


def test_an_upload_for_a_user_is_theirs(sandbox: Sandbox, tmp_path: Path) -> None:
    """upload_dir(user=...) gives what it makes to that user, as files.write does, so
    their commands can change it; by default it is root's; a replaced file keeps its
    owner."""
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("1\n")
    os.symlink("pkg/m.py", src / "link")
    files = sandbox.files
    assert files.upload_dir(src, "/workspace/a/b", user="user").files == 1
    files.upload_dir(src, "/workspace/r")
    files.upload_dir(src, "/workspace/r", user="user")  # replaces m.py and the link

    def owners(*paths: str) -> list[str]:
        return sandbox.commands.run(f"stat -c %U:%G {' '.join(paths)}").stdout.split()

    mine = ["/workspace/a", "/workspace/a/b", "/workspace/a/b/pkg", "/workspace/a/b/pkg/m.py",
            "/workspace/a/b/link", "/workspace/r/link"]
    assert owners(*mine) == ["user:user"] * len(mine)
    assert owners("/workspace/r", "/workspace/r/pkg", "/workspace/r/pkg/m.py") == \
        ["root:root"] * 3
    edit = sandbox.commands.run("echo 2 >> /workspace/a/b/pkg/m.py && touch "
                                "/workspace/a/b/pkg/new && echo ok", user="user")
    assert edit.stdout == "ok\n", edit.stderr
    with pytest.raises(InvalidArgumentError, match="user"):
        files.upload_dir(src, "/workspace/x", user="no body")


def _hostile_tar() -> bytes:
    def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
               link: str = "") -> bytes:
        info = tarfile.TarInfo(name)
        info.type, info.size, info.linkname = kind, len(data), link
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + \
            bytes(-len(data) % 512)

    return b"".join([member("../../etc/owned", b"x"), member("/etc/owned2", b"x"),
                     member("ln", kind=tarfile.SYMTYPE, link="/etc"),
                     member("ln/owned3", b"x"), member("ok", b"fine")]) + bytes(1024)


def test_a_crafted_archive_is_refused_by_the_guest(sandbox: Sandbox) -> None:
    provider = sandbox._provider
    result = provider.write_dir_archive(sandbox.sandbox_id, "/workspace/h", _hostile_tar())
    assert len(result.skipped) == 3 and result.files == 1
    check = sandbox.commands.run("ls /etc/owned /etc/owned2 /etc/owned3 /owned 2>&1; "
                                 "cat /workspace/h/ok")
    assert check.stdout.count("No such file") == 4 and check.stdout.endswith("fine")
    with pytest.raises(InvalidArgumentError, match="not a valid tar stream"):
        provider.write_dir_archive(sandbox.sandbox_id, "/workspace/h2", b"\x01" * 4096)


def test_errors(sandbox: Sandbox, tmp_path: Path) -> None:
    files = sandbox.files
    with pytest.raises(NotFoundError):
        files.upload_dir(tmp_path / "missing", "/workspace/x")
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        files.upload_dir(tmp_path / "f", "/workspace/x")
    with pytest.raises(NotFoundError):
        files.download_dir("/workspace/missing", tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()
    files.write("/workspace/file", "x")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        files.download_dir("/workspace/file", tmp_path / "d")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        files.upload_dir(tmp_path, "/workspace/file")
    with pytest.raises(InvalidArgumentError, match="relative"):
        files.upload_dir(tmp_path, "workspace/x")
    with pytest.raises(InvalidArgumentError, match="exists and is not a directory"):
        files.download_dir("/workspace", tmp_path / "f")
    with pytest.raises(InvalidArgumentError, match="max_bytes"):
        files.download_dir("/workspace", tmp_path / "g", max_bytes=0)


def test_async_twin(sandbox: Sandbox, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("async")

    async def scenario() -> None:
        sb = await AsyncSandbox.connect(sandbox.sandbox_id)
        assert (await sb.files.upload_dir(tmp_path / "in", "/workspace/as")).files == 1
        assert (await sb.files.download_dir("/workspace/as", tmp_path / "out")).files == 1

    asyncio.run(scenario())
    assert (tmp_path / "out" / "a.txt").read_text() == "async"
