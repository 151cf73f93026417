"""Files: text and bytes, listing, metadata, errors, and 1 GiB streamed both ways."""

from __future__ import annotations

import hashlib
import resource
from collections.abc import Iterator

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError

pytestmark = pytest.mark.integration


def test_text_bytes_mode_and_listing(sandbox: Sandbox) -> None:
    files = sandbox.files
    assert files.write("/workspace/d/e/f.txt", "héllo") == len("héllo".encode())
    assert files.read("/workspace/d/e/f.txt") == "héllo"
    files.write("/workspace/blob.bin", bytes(range(256)), mode=0o600)
    assert files.read("/workspace/blob.bin", format="bytes") == bytes(range(256))
    assert files.stat("/workspace/blob.bin").mode & 0o777 == 0o600
    assert sandbox.commands.run("stat -c %a /workspace/blob.bin").stdout == "600\n"

    top = {e.name: e for e in files.list("/workspace")}
    assert top["d"].type == "dir" and top["blob.bin"].size == 256
    deep = {e.path for e in files.list("/workspace", depth=3)}
    assert "/workspace/d/e/f.txt" in deep

    files.rename("/workspace/blob.bin", "/workspace/moved.bin")
    assert not files.exists("/workspace/blob.bin") and files.exists("/workspace/moved.bin")
    files.make_dir("/workspace/newdir/sub")
    assert files.stat("/workspace/newdir/sub").type == "dir"
    files.remove("/workspace/d")
    assert not files.exists("/workspace/d/e/f.txt")


def test_files_made_for_a_user_are_theirs(sandbox: Sandbox) -> None:
    """What is written or made for ``user`` (with the directories made on the way) is
    theirs, so their commands can change it; what existed keeps its owner."""
    files = sandbox.files
    files.write("/workspace/u/v/w.txt", "one\n", user="user")
    files.make_dir("/workspace/m/n", user="user")
    files.write("/workspace/rootfile", "r")
    owners = sandbox.commands.run("stat -c %U /workspace/u /workspace/u/v /workspace/u/v/w.txt"
                                  " /workspace/m /workspace/m/n /workspace/rootfile /"
                                  ).stdout.split()
    assert owners == ["user"] * 5 + ["root", "root"]
    sandbox.commands.run("echo two >> /workspace/u/v/w.txt && touch /workspace/m/n/x",
                         user="user")
    assert files.read("/workspace/u/v/w.txt") == "one\ntwo\n"
    files.write("/workspace/rootfile", "replaced", user="user")  # keeps its owner
    assert sandbox.commands.run("stat -c %U /workspace/rootfile").stdout == "root\n"
    with pytest.raises(InvalidArgumentError, match="user"):
        files.write("/workspace/x", "x", user="no body")


def test_read_at_any_offset(sandbox: Sandbox) -> None:
    """Any offset the API takes gets an answer: what is there, nothing past the end, also
    past the largest file the filesystem can hold (where the kernel refuses to seek)."""
    files = sandbox.files
    for path in ("/workspace/five", "/five"):  # the volume, the system layer
        files.write(path, "hello")
        for offset, want in ((0, b"hello"), (3, b"lo"), (5, b""), (2**31, b""),
                             (2**62 - 1, b""), (2**62, b"")):
            assert files.read(path, format="bytes", offset=offset) == want, offset
            assert b"".join(files.read(path, format="stream", offset=offset)) == want
        for bad in (-1, 2**62 + 1, True):
            with pytest.raises(InvalidArgumentError, match="offset"):
                files.read(path, offset=bad)


def test_file_errors(sandbox: Sandbox) -> None:
    files = sandbox.files
    with pytest.raises(NotFoundError):
        files.read("/workspace/missing.txt")
    with pytest.raises(InvalidArgumentError, match="relative"):
        files.read("workspace/x")
    with pytest.raises(InvalidArgumentError, match="NUL"):
        files.write("/workspace/a\x00b", "x")
    with pytest.raises(InvalidArgumentError, match="mode"):
        files.write("/workspace/x", "x", mode=-1)
    with pytest.raises(InvalidArgumentError, match="directory"):
        files.read("/workspace")
    files.write("/workspace/latin1.txt", "caf\xe9".encode("latin-1"))
    with pytest.raises(InvalidArgumentError, match="not UTF-8"):
        files.read("/workspace/latin1.txt")
    with pytest.raises(InvalidArgumentError, match="format"):
        files.read("/workspace/latin1.txt", format="yaml")  # type: ignore[call-overload]
    with pytest.raises(InvalidArgumentError, match="depth"):
        files.list("/workspace", depth=0)


def _chunks(total: int, size: int = 1 << 20) -> Iterator[bytes]:
    block = bytes(range(256)) * (size // 256)
    sent = 0
    while sent < total:
        piece = block[: min(size, total - sent)]
        sent += len(piece)
        yield piece


@pytest.mark.slow
def test_one_gib_streams_without_being_held_in_memory() -> None:
    total = 1 << 30
    with Sandbox.create(disk_mb=1400) as sb:
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        assert sb.files.write("/workspace/big.bin", _chunks(total)) == total
        digest = hashlib.sha256()
        received = 0
        for chunk in sb.files.read("/workspace/big.bin", format="stream"):
            digest.update(chunk)
            received += len(chunk)
        rss_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        expected = hashlib.sha256()
        for chunk in _chunks(total):
            expected.update(chunk)
        assert received == total and digest.hexdigest() == expected.hexdigest()
        assert rss_growth_mb < 128, f"client peak memory grew {rss_growth_mb:.0f} MB"
        # And the guest's own peak stayed small: its VmHWM is read from inside.
        hwm = sb.commands.run("grep VmHWM /proc/1/status").stdout.split()[1]
        assert int(hwm) < 128 * 1024, f"guest peak {hwm} kB"
