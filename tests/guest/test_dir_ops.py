"""Directory transfers through a real guest agent process (``tar_in``/``tar_out``), and
the host's download path fed by a lying guest that sends hostile archives."""

from __future__ import annotations

import os
import socket
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _agent import running_guest
from _tars import END, chunks_of, member, packed, stream, tree, unpack
from lyingguest import lying_guests

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, SandboxError
from agent_sandbox.guest import protocol as proto
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.sdk import dirs


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestClient]:
    with running_guest(tmp_path_factory.mktemp("guest")) as guest:
        yield guest


def test_round_trip_through_the_guest(client: GuestClient, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "e" / "f.bin").write_bytes(os.urandom(5 << 20))  # several frames
    (src / "x.txt").write_text("x")
    os.symlink("d/e/f.bin", src / "link")
    os.symlink("/etc/hostname", src / "abs")
    data, _ = packed(src)
    inside = tmp_path / "inside" / "made" / "by" / "guest"
    summary = client.write_tar(str(inside), chunks_of(data, 1 << 20))
    assert (summary["files"], summary["dirs"], summary["symlinks"]) == (2, 2, 2)
    assert summary["bytes"] == (5 << 20) + 1 and summary["skipped"] == []
    assert tree(inside) == tree(src)  # the upload side keeps every link as it is
    back = unpack(tmp_path / "back", iter(client.read_tar(str(inside))), outside_links=True)
    assert tree(tmp_path / "back") == tree(src) and back["skipped"] == []


def test_uploads_never_write_through_planted_symlinks(client: GuestClient,
                                                      tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "passwd").write_text("root")
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(victim, dst / "planted")
    os.symlink(victim / "passwd", dst / "file")
    summary = client.write_tar(str(dst), [stream(
        member("planted/passwd", b"owned"), member("../victim/passwd", b"owned"),
        member(str(victim / "passwd"), b"owned"), member("file", b"replaced"))])
    assert tree(victim) == {"passwd": ("file", b"root", 0o644)}
    assert (dst / "file").read_bytes() == b"replaced" and not (dst / "file").is_symlink()
    assert sorted(summary["skipped"]) == sorted([
        "planted/passwd: goes through the symlink planted; skipped",
        "../victim/passwd: an absolute name or one with '..' in it; skipped",
        f"{victim / 'passwd'}: an absolute name or one with '..' in it; skipped"])


def test_uploads_made_for_a_user_are_theirs(client: GuestClient, tmp_path: Path) -> None:
    """What tar_in makes for ``user`` is theirs (the target, the directories made for it,
    files, directories, links); what existed keeps its owner, a replaced file too; and a
    link is given away itself, never what it points to."""
    nobody = (65534, 65534)  # the host's account: this guest reads the host's /etc/passwd
    victim = tmp_path / "victim"
    victim.write_text("root's")
    dst = tmp_path / "up"
    (dst / "old").mkdir(parents=True)
    (dst / "kept").write_text("4242's")
    os.chown(dst / "kept", 4242, 4242)
    summary = client.write_tar(str(dst / "new" / "deep"), [stream(
        member("d/", kind=tarfile.DIRTYPE, mode=0o755), member("d/f", b"f"),
        member("link", kind=tarfile.SYMTYPE, link=str(victim)))], user="nobody")
    assert summary["skipped"] == []
    client.write_tar(str(dst), [stream(member("old/g", b"g"), member("kept", b"new"))],
                     user="nobody")

    def owner(*parts: str) -> tuple[int, int]:
        st = os.lstat(dst.joinpath(*parts))
        return st.st_uid, st.st_gid

    made = [("new",), ("new", "deep"), ("new", "deep", "d"), ("new", "deep", "d", "f"),
            ("new", "deep", "link"), ("old", "g")]
    assert {p: owner(*p) for p in made} == {p: nobody for p in made}
    assert owner() == owner("old") == (0, 0) and victim.stat().st_uid == 0
    assert owner("kept") == (4242, 4242) and (dst / "kept").read_text() == "new"
    client.write_tar(str(dst), [stream(member("rootfile", b"r"))])  # default: root's
    assert owner("rootfile") == (0, 0)
    with pytest.raises(InvalidArgumentError, match="'user' must be an account name"):
        client.write_tar(str(dst), [stream(member("x", b"x"))], user="no body")


def test_guest_errors_are_clear(client: GuestClient, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgumentError, match="exists and is not a directory"):
        client.write_tar(str(tmp_path / "file"), [stream(member("a", b"a"))])
    with pytest.raises(NotFoundError, match="no such file"):
        client.read_tar(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        client.read_tar(str(tmp_path / "file"))
    with pytest.raises(InvalidArgumentError, match="not a valid tar stream"):
        client.write_tar(str(tmp_path / "junk"), [b"\x00junk" * 300])
    with pytest.raises(InvalidArgumentError, match="without its end marker"):
        client.write_tar(str(tmp_path / "cut"), [stream(member("a", b"a"), end=False)])
    assert client.ping()["version"] == 1


@pytest.fixture
def liar() -> Iterator[Callable[[bytes], str]]:
    """liar(archive) -> socket path of a 'guest' answering tar_out with that archive."""
    def tar_out(archive: bytes) -> Callable[[socket.socket, dict], None]:
        def reply(conn: socket.socket, req: dict) -> None:
            for piece in chunks_of(archive, 100_000):
                proto.send_frame(conn, {"chunk": True}, piece)
            proto.send_frame(conn, {"done": True, "size": len(archive)})
        return reply

    with lying_guests() as start:
        yield lambda archive: start(tar_out(archive))


class _GuestDownloads:
    """The one Provider method ``download_dir`` calls, answered by a guest directly."""

    def __init__(self, client: GuestClient) -> None:
        self.client = client

    def read_dir_archive(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        return self.client.read_tar(path)


def _download(sock: str, dst: Path, **kw: object) -> object:
    opts: dict[str, object] = {"max_bytes": 1 << 30, "max_entries": 1000,
                               "outside_links": False, **kw}
    return dirs.download_dir(_GuestDownloads(GuestClient(sock)), "sbx-0000000000",  # type: ignore[arg-type]
                             "/workspace", dst, **opts)  # type: ignore[arg-type]


def test_a_lying_guest_cannot_write_outside_the_download(liar: Callable[[bytes], str],
                                                         tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    hostile = stream(
        member("../victim/dotdot", b"owned"),
        member(str(victim / "absolute"), b"owned"),
        member("esc", kind=b"2", link=str(victim)),
        member("esc/through", b"owned"),
        member("up", kind=b"2", link="../victim"),
        member("hard", kind=b"1", link=str(victim / "x")),
        member("suid", b"ok", mode=0o4755),
        member("inside/ok.txt", b"fine"),
    )
    dst = tmp_path / "dst"
    result = _download(liar(hostile), dst)
    assert os.listdir(victim) == []
    assert tree(dst) == {"inside": ("dir", None, 0o755),
                         "inside/ok.txt": ("file", b"fine", 0o644),
                         "esc": ("dir", None, 0o755),  # a real directory, inside
                         "esc/through": ("file", b"owned", 0o644),
                         "suid": ("file", b"ok", 0o755)}
    assert len(result.skipped) == 5, result.skipped  # type: ignore[attr-defined]
    # Links kept (outside_links=True), but still never gone through:
    result = _download(liar(hostile), tmp_path / "dst2", outside_links=True)
    assert os.listdir(victim) == [] and os.readlink(tmp_path / "dst2" / "esc") == str(victim)
    assert "esc/through: goes through the symlink esc; skipped" in result.skipped  # type: ignore[attr-defined]


def test_a_lying_guest_hits_the_caps(liar: Callable[[bytes], str], tmp_path: Path) -> None:
    big = stream(member("zeros", bytes(3 << 20)))
    with pytest.raises(InvalidArgumentError, match="larger than max_bytes=1048576 .*larger "
                                                   "max_bytes"):
        _download(liar(big), tmp_path / "a", max_bytes=1 << 20)
    with pytest.raises(SandboxError, match="cannot be trusted"):
        _download(liar(member("cut", b"abc")), tmp_path / "b")
    with pytest.raises(SandboxError, match="after its end marker"):
        _download(liar(END + b"\x07" * (3 << 20)), tmp_path / "c")
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        _download(liar(stream(*(member(f"{i}") for i in range(20)))), tmp_path / "d",
                  max_entries=5)
