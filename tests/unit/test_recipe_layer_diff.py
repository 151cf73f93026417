"""A RUN's layer read out of a hostile upper directory: nothing in it is followed, device
nodes are dropped, whiteouts and opaque directories kept, setuid bits kept with owners
mapped back from the sandboxes' id range, hard links kept only within the layer, and the
layer bounded."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from agent_sandbox.backends.runc.templates.layer_diff import Budget, capture
from agent_sandbox.config.engine import HOST_ID_BASE
from agent_sandbox.core.errors import InvalidArgumentError, ResourceExhaustedError

pytestmark = [pytest.mark.quick,
              pytest.mark.skipif(os.geteuid() != 0, reason="makes device nodes and owners "
                                 "(root only)")]
ROOT = HOST_ID_BASE  # the sandbox's root, as the host sees its files


def _upper(tmp: Path) -> Path:
    up = tmp / "upper"
    (up / "etc").mkdir(parents=True)
    (up / "etc" / "conf").write_text("mine\n")
    os.symlink("/etc/shadow", up / "evil")  # a link to a host secret
    os.symlink("/", up / "hostroot")
    (up / "bin").mkdir()
    tool = up / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    os.chown(tool, ROOT, ROOT)
    os.chmod(tool, 0o4755)  # setuid root (the sandbox's)
    os.mknod(up / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(up / "disk", stat.S_IFBLK | 0o600, os.makedev(8, 0))
    os.mknod(up / "gone", stat.S_IFCHR, 0)  # an overlay whiteout
    os.mkfifo(up / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(up / "sock"))
    sock.close()
    (up / "a").write_text("linked\n")
    os.link(up / "a", up / "etc" / "b")
    (up / "opaque").mkdir()
    os.setxattr(up / "opaque", "trusted.overlay.opaque", b"y")
    hostfile = tmp / "hostowned"
    hostfile.write_text("host\n")
    os.chown(hostfile, 0, 0)
    for path in up.rglob("*"):
        if not path.is_symlink() and path.name != "tool":
            os.chown(path, ROOT + 1000, ROOT + 1000)
    os.chown(up / "etc" / "conf", 0, 0)  # outside the sandboxes' range
    return up


def test_hostile_upper_dir(tmp_path: Path) -> None:
    up = _upper(tmp_path)
    out = tmp_path / "layer"
    capture(str(up), str(out), Budget(max_bytes=1 << 20))
    assert os.readlink(out / "evil") == "/etc/shadow" and os.readlink(out / "hostroot") == "/"
    tool = os.lstat(out / "bin" / "tool")
    assert stat.S_IMODE(tool.st_mode) == 0o4755 and (tool.st_uid, tool.st_gid) == (0, 0)
    assert os.lstat(out / "a").st_uid == 1000
    assert os.lstat(out / "etc" / "conf").st_uid == 65534  # not the host's root
    assert not os.path.lexists(out / "null") and not os.path.lexists(out / "disk")
    assert not os.path.lexists(out / "sock")
    gone = os.lstat(out / "gone")
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == 0
    assert stat.S_ISFIFO(os.lstat(out / "fifo").st_mode)
    assert os.lstat(out / "a").st_ino == os.lstat(out / "etc" / "b").st_ino
    assert os.getxattr(out / "opaque", "trusted.overlay.opaque") == b"y"


def test_a_hard_link_to_a_file_outside_the_layer_refuses_it(tmp_path: Path) -> None:
    up = tmp_path / "upper"
    up.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("host secret\n")
    os.link(secret, up / "stolen")
    with pytest.raises(InvalidArgumentError, match="hard linked to a file outside"):
        capture(str(up), str(tmp_path / "layer"), Budget(max_bytes=1 << 20))


def test_a_huge_layer_is_refused(tmp_path: Path) -> None:
    up = tmp_path / "upper"
    up.mkdir()
    with open(up / "huge", "wb") as fh:
        fh.truncate(10 << 30)  # sparse: 10 GiB listed, nothing on disk
    with pytest.raises(ResourceExhaustedError, match="over 1 MiB"):
        capture(str(up), str(tmp_path / "layer"), Budget(max_bytes=1 << 20))


def test_overlay_metacopy_entries_are_refused(tmp_path: Path) -> None:
    up = tmp_path / "upper"
    up.mkdir()
    (up / "f").write_text("")
    os.setxattr(up / "f", "trusted.overlay.metacopy", b"")
    with pytest.raises(InvalidArgumentError, match="metacopy"):
        capture(str(up), str(tmp_path / "layer"), Budget(max_bytes=1 << 20))


def test_a_symlinked_upper_dir_is_not_followed(tmp_path: Path) -> None:
    os.symlink("/etc", tmp_path / "upper")
    with pytest.raises(OSError):
        capture(str(tmp_path / "upper"), str(tmp_path / "layer"), Budget(max_bytes=1 << 20))


def test_a_remote_context_is_bounded_before_it_is_unpacked(tmp_path: Path) -> None:
    import io
    import tarfile

    from agent_sandbox.backends.runc.templates.recipe_layers import RecipeLayers
    from agent_sandbox.backends.runc.templates.store import TemplateStore

    store = TemplateStore(tmp_path / "templates", lambda folder: None)  # type: ignore[arg-type,return-value]
    layers = RecipeLayers(store, max_layer_bytes=1 << 20, max_context_bytes=1 << 20)
    assert stat.S_IMODE(os.stat(layers.root).st_mode) == 0o700
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("big")
        info.size = 2 << 20
        tar.addfile(info, io.BytesIO(b"\0" * info.size))
    with pytest.raises(ResourceExhaustedError, match="over 1 MiB unpacked"), \
            layers.unpacked([buf.getvalue()]):
        pass
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp")]
