"""The tar code both ends of a directory transfer run (``guest/dir_pack.py``,
``guest/dir_unpack.py``): a faithful round trip, and hostile streams refused, with
nothing ever written outside the target directory.

The extractor is what the host runs on what a sandbox sends, so every trick a hostile
archive has is tried here on crafted streams; tests/sdk/test_dirs.py drives the same
through real sandboxes and the gateway.
"""

from __future__ import annotations

import os
import socket
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _tars import END, member, packed, stream, tree, unpack

from agent_sandbox.guest.dir_pack import TRAILER_KEY, ArchiveError


def _source(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a" / "b" / "f.txt").write_text("hello\n")
    (root / "big.bin").write_bytes(os.urandom(3 << 20) + b"tail")
    (root / "private").write_bytes(b"secret")
    (root / "private").chmod(0o600)
    (root / "tool").write_bytes(b"#!/bin/sh\n")
    (root / "tool").chmod(0o4755)  # setuid: not carried over
    os.utime(root / "private", (1_000_000_000, 1_000_000_000))
    os.symlink("b/f.txt", root / "a" / "rel")
    os.symlink("/etc/passwd", root / "abs")
    os.symlink("../../up", root / "a" / "b" / "upward")
    os.symlink("nowhere", root / "dangling")
    os.link(root / "private", root / "hard")
    (root / ("n" * 200)).write_text("long name")
    (root / "new\nline").write_text("newline")
    os.mkfifo(root / "fifo")
    (root / os.fsdecode(b"latin\xe9")).write_bytes(b"not utf-8")


def test_round_trip_keeps_files_links_modes_and_names(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _source(src)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(src / "sock"))
        data, sent_notes = packed(src)
    assert len(sent_notes) == 2 and all("skipped" in n for n in sent_notes)
    summary = unpack(dst, data, outside_links=True)
    want = tree(src)
    for special in ("fifo", "sock"):
        del want[special]
    want["tool"] = ("file", b"#!/bin/sh\n", 0o755)
    got = tree(dst)
    assert got.keys() == want.keys()
    for name, (kind, content, mode) in want.items():
        assert got[name][:2] == (kind, content), name
        if kind == "file":
            assert got[name][2] == mode, name
    assert (dst / "private").stat().st_mtime == 1_000_000_000
    assert not (dst / "hard").samefile(dst / "private")  # hard links arrive as copies
    assert summary["files"] == 8 and summary["symlinks"] == 4 and summary["dirs"] == 3
    assert summary["bytes"] == sum(len(c) for k, c, _ in want.values() if k == "file")
    skipped = "\n".join(summary["skipped"])
    assert "fifo: a fifo" in skipped and "sock: a socket" in skipped


def test_links_out_of_the_tree_are_skipped_unless_allowed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    os.symlink("/etc", src / "abs")
    os.symlink("../../out", src / "a" / "up2")
    os.symlink("../in", src / "a" / "up1")
    summary = unpack(tmp_path / "dst", packed(src)[0])
    assert tree(tmp_path / "dst") == {"a": ("dir", None, 0o755),
                                      "a/up1": ("link", "../in", 0)}
    assert sorted(summary["skipped"]) == [
        "a/up2: a symlink to ../../out, outside the directory; skipped",
        "abs: a symlink to /etc, outside the directory; skipped"]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A directory outside every target: nothing may ever appear in it."""
    outside = tmp_path / "victim"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0\n")
    return outside


def _untouched(victim: Path) -> None:
    assert tree(victim) == {"passwd": ("file", b"root:x:0:0\n", 0o644)}


def test_absolute_and_dotdot_names_are_refused(tmp_path: Path, victim: Path) -> None:
    dst = tmp_path / "t" / "dst"
    summary = unpack(dst, stream(
        member("../../victim/passwd", b"owned"),
        member("ok/../../../victim/evil", b"owned"),
        member(str(victim / "abs"), b"owned"),
        member("/etc", kind=tarfile.DIRTYPE),
        member("fine.txt", b"fine"),
    ), outside_links=True)
    _untouched(victim)
    assert tree(dst) == {"fine.txt": ("file", b"fine", 0o644)}
    assert len(summary["skipped"]) == 4
    assert all("an absolute name or one with '..' in it" in n for n in summary["skipped"])


def test_a_member_never_goes_through_a_symlink(tmp_path: Path, victim: Path) -> None:
    dst = tmp_path / "dst"
    summary = unpack(dst, stream(
        member("a", kind=tarfile.SYMTYPE, link=str(victim)),
        member("a/passwd", b"owned"),
        member("b", kind=tarfile.SYMTYPE, link="../victim"),
        member("b/new", b"owned"),
        member("c", kind=tarfile.SYMTYPE, link="."),
        member("c/c/loop", b"owned"),
        member("b", kind=tarfile.DIRTYPE),  # a directory over the link: not through it
    ), outside_links=True)
    _untouched(victim)
    assert os.readlink(dst / "a") == str(victim) and os.readlink(dst / "b") == "../victim"
    assert not (dst / "loop").exists()
    notes = "\n".join(summary["skipped"])
    assert "a/passwd: goes through the symlink a; skipped" in notes
    assert "b/new: goes through the symlink b; skipped" in notes
    assert "c/c/loop: goes through the symlink c; skipped" in notes
    assert "b: a symlink of that name is in the way; skipped" in notes


def test_symlinks_already_in_the_target_are_not_followed(tmp_path: Path, victim: Path) -> None:
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(victim / "passwd", dst / "file")
    os.symlink(victim, dst / "dir")
    summary = unpack(dst, stream(member("file", b"new"), member("dir/x", b"owned"),
                                 member("dir", kind=tarfile.DIRTYPE, mode=0o777)))
    _untouched(victim)
    assert (dst / "file").read_bytes() == b"new" and not (dst / "file").is_symlink()
    assert (dst / "dir").is_symlink()
    assert "dir/x: goes through the symlink dir; skipped" in summary["skipped"]


def test_special_members_and_bits_are_dropped(tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    summary = unpack(dst, stream(
        member("hard", kind=tarfile.LNKTYPE, link="/etc/passwd"),
        member("null", kind=tarfile.CHRTYPE),
        member("disk", kind=tarfile.BLKTYPE),
        member("pipe", kind=tarfile.FIFOTYPE),
        member("odd", b"data", kind=b"Z"),
        member("suid", b"x", mode=0o6755),
        member("shut", kind=tarfile.DIRTYPE, mode=0o000),
        member("shut/inner", b"y", mode=0o1777),
        member("f", kind=tarfile.DIRTYPE, mode=0o755),
        member("f", b"file where a dir is"),
    ))
    assert tree(dst) == {"suid": ("file", b"x", 0o755), "shut": ("dir", None, 0o700),
                         "shut/inner": ("file", b"y", 0o777), "f": ("dir", None, 0o755)}
    notes = "\n".join(summary["skipped"])
    assert "hard: a hard link" in notes and "null: a device or fifo" in notes
    assert "disk: a device" in notes and "pipe: a device or fifo" in notes
    assert "odd: an unsupported entry type" in notes
    assert "f: a directory of that name is in the way" in notes


def test_names_are_escaped_in_notes(tmp_path: Path) -> None:
    summary = unpack(tmp_path / "d", stream(member("../\x1b[31mred\n", b"x")))
    assert summary["skipped"] == ["../\\x1b[31mred\\n: an absolute name or one with '..' in "
                                  "it; skipped"]


def _refused(tmp_path: Path, data: bytes | Iterator[bytes], match: str, **kw: object) -> None:
    with pytest.raises(ArchiveError, match=match):
        unpack(tmp_path / "dst", data, **kw)  # type: ignore[arg-type]


def test_broken_streams_are_refused(tmp_path: Path) -> None:
    one = member("a.txt", b"abc")
    _refused(tmp_path, b"", "not a valid tar stream")
    _refused(tmp_path, stream(one, end=False), "without its end marker")
    _refused(tmp_path, one + b"garbage" * 200 + END, "without its end marker")
    _refused(tmp_path, member("big", b"x" * 10, size=1 << 40) + END, "not a valid tar")
    _refused(tmp_path, stream(one) + b"\x01" * (2 << 20), "after its end marker")
    assert unpack(tmp_path / "ok", stream(one) + bytes(9 << 10))["files"] == 1  # padding


def test_headers_that_would_hold_memory_are_refused(tmp_path: Path) -> None:
    huge = member("x", b"", pax={"comment": "c" * (1 << 20)})
    _refused(tmp_path, stream(huge), "extended header of")
    chain = b"".join(tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
        {"comment": str(i)}, tarfile.XHDTYPE, "utf-8") for i in range(6))
    _refused(tmp_path, chain + stream(member("x", b"")), "in a row")
    glob = tarfile.TarInfo.create_pax_global_header({"comment": "g"})
    _refused(tmp_path, glob + stream(member("x")), "global header")
    _refused(tmp_path, stream(member("s", kind=tarfile.GNUTYPE_SPARSE, fmt=tarfile.GNU_FORMAT)),
             "sparse")
    sparse10 = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s",
                "GNU.sparse.realsize": "1"}
    endless_map = b"99999999999\n" * 100
    _refused(tmp_path, stream(member("s", endless_map, pax=sparse10)), "sparse")
    long_name = member("L" * 300, b"")  # a long name within the cap is fine
    assert unpack(tmp_path / "ok", stream(long_name))["files"] == 0  # ENAMETOOLONG: a note


def _zeros_member(size: int) -> Iterator[bytes]:
    """A stream made on demand: one member of ``size`` zero bytes."""
    yield member("zeros", size=size)
    left = size
    while left:
        piece = min(left, 1 << 20)
        yield bytes(piece)
        left -= piece
    yield END


def test_caps_stop_an_endless_sender(tmp_path: Path) -> None:
    _refused(tmp_path, _zeros_member(1 << 40), "larger than max_bytes=8388608",
             max_bytes=8 << 20)
    assert os.listdir(tmp_path / "dst") == []  # the part-written file is gone
    many = stream(*(member(f"f{i}", b"") for i in range(50)))
    _refused(tmp_path, many, "more than max_entries=10", max_entries=10)


def test_sender_notes_travel_and_bad_ones_are_said(tmp_path: Path) -> None:
    notes = stream(member("./", kind=tarfile.DIRTYPE, pax={TRAILER_KEY: '["x: a socket"]'}))
    assert unpack(tmp_path / "a", notes)["skipped"] == ["x: a socket"]
    bad = stream(member("./", kind=tarfile.DIRTYPE, pax={TRAILER_KEY: '{"no": 1}'}))
    assert unpack(tmp_path / "b", bad)["skipped"] == [
        "the sender's list of skipped entries is malformed"]
    assert stat.S_ISDIR((tmp_path / "b").stat().st_mode)
