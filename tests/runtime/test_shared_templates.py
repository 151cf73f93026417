"""Shared templates are trusted only when root's alone; the package index check is quick.

Unit tests: real directories and files in a temp dir. The ones that need root-owned files
skip without root.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from agent_sandbox.backends.runc.templates import package_index
from agent_sandbox.backends.runc.templates.shared import (
    SharedTemplates,
    Untrusted,
    open_trusted_dir,
    verify_tree,
)
from agent_sandbox.core.templates import Layer, Template

NAME = "code-interpreter-v1"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned files need root")


def _make(root: Path, *, rootfs: str = "rootfs-1a2b") -> Path:
    """A shared directory holding one template the way root's build leaves it."""
    env = root / NAME / rootfs / "opt" / "abx-python"
    (env / "bin").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.symlink("/usr/bin/python3", env / "bin" / "python")
    tmpl = Template(name=NAME, kind="built",
                    layers=[Layer("/", [str(root / NAME / rootfs)])])
    (root / NAME / "template.json").write_text(json.dumps(tmpl.to_json()))
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):  # chmod follows links: never touch the host's
                os.chmod(path, 0o644)
    return root


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    # /var/tmp-like parents (sticky, world-writable) are passable; tmp_path's are root's
    # 0700 dirs when the tests run as root, the user's own otherwise.
    return _make(tmp_path / "shared")


def _why(root: Path) -> str:
    with pytest.raises(Untrusted) as info:
        SharedTemplates(root, mirror_dirs=False).check(NAME)
    return str(info.value)


def test_not_root_owned_is_refused(shared: Path) -> None:
    if os.geteuid() == 0:
        os.chown(shared / NAME, 65534, 65534)  # a user's directory in root's tree
    why = _why(shared)
    assert "not root" in why and "owned by uid" in why, why
    assert SharedTemplates(shared, mirror_dirs=False).load(NAME) is None


def test_symlinked_component_is_refused(shared: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    os.symlink(shared, link)
    with pytest.raises(Untrusted) as info:
        open_trusted_dir(link)
    if os.geteuid() == 0:  # (as a user, its own tmp_path is refused before the link)
        assert str(info.value) == f"{link} is a symbolic link (never followed)"
    assert SharedTemplates(link, mirror_dirs=False).load(NAME) is None
    assert SharedTemplates(link, mirror_dirs=False).names() == []


@as_root
def test_root_owned_tree_is_used(shared: Path) -> None:
    store = SharedTemplates(shared, mirror_dirs=False)
    tmpl = store.load(NAME)
    assert tmpl is not None and tmpl.layers[0].lowers == [str(shared / NAME / "rootfs-1a2b")]
    assert store.names() == [NAME]
    dirs = dict(verify_tree(Path(tmpl.layers[0].lowers[0])))
    assert set(dirs) == {"opt", "opt/abx-python", "opt/abx-python/bin"}


@as_root
@pytest.mark.parametrize("where", ["root", "folder", "meta"])
def test_group_or_other_writable_is_refused(shared: Path, where: str) -> None:
    path = {"root": shared, "folder": shared / NAME,
            "meta": shared / NAME / "template.json"}[where]
    os.chmod(path, 0o775 if path.is_dir() else 0o646)
    assert "writable by group or others" in _why(shared)


@as_root
def test_writable_or_foreign_entry_deep_in_the_tree_is_refused(tmp_path: Path) -> None:
    for index, (mode, owner) in enumerate([(0o666, 0), (0o644, 65534)]):
        root = _make(tmp_path / f"s{index}", rootfs=f"rootfs-{index}")
        cfg = root / NAME / f"rootfs-{index}" / "opt" / "abx-python" / "pyvenv.cfg"
        os.chmod(cfg, mode)
        os.chown(cfg, owner, owner)
        store = SharedTemplates(root, mirror_dirs=False)
        tmpl = store.check(NAME)  # the path to it is fine ...
        with pytest.raises(Untrusted, match="pyvenv.cfg"):  # ... its tree is not
            store.layers_on(Template("base", "base", [Layer("/", ["/x"])]), tmpl, tmp_path)


@as_root
def test_layer_outside_its_folder_is_refused(shared: Path) -> None:
    meta = shared / NAME / "template.json"
    data = json.loads(meta.read_text())
    data["layers"][0]["lowers"] = ["/usr"]
    meta.write_text(json.dumps(data))
    assert "outside it" in _why(shared)


@as_root
def test_sticky_world_writable_ancestor_is_passed(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    root = _make(sticky / "shared")
    assert SharedTemplates(root, mirror_dirs=False).load(NAME) is not None
    os.chmod(root, 0o1777)  # the shared directory itself: never
    assert "writable by group or others" in _why(root)


@as_root
def test_rootless_layers_get_a_mirror_of_directories_only(shared: Path, tmp_path: Path
                                                          ) -> None:
    own = tmp_path / "own"
    own.mkdir()
    store = SharedTemplates(shared, mirror_dirs=True)
    tmpl = store.check(NAME)
    base = Template("base", "base", [Layer("/", ["/skeleton"]), Layer("/usr", ["/u"])])
    layers = store.layers_on(base, tmpl, own)
    lower = str(shared / NAME / "rootfs-1a2b")
    mirror = own / "_shared" / NAME / "rootfs-1a2b"
    assert layers == [Layer("/", [str(mirror), lower, "/skeleton"]), Layer("/usr", ["/u"])]
    found = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*"))
    assert found == ["opt", "opt/abx-python", "opt/abx-python/bin"]  # no files, no links


# the package index ------------------------------------------------------------------------
def test_index_url_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert package_index.index_url() == "https://mirror.example/simple"
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple")
    assert package_index.index_url() == "https://env.example/simple"
    assert package_index.index_url(" http://given/simple ") == "http://given/simple"
    monkeypatch.delenv("PIP_INDEX_URL")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "none"))
    if not Path("/etc/pip.conf").exists():
        assert package_index.index_url() == package_index.PYPI


def test_unreachable_index_is_named_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as closed:  # a local port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    why = package_index.unreachable(f"http://127.0.0.1:{port}/simple")
    took = time.monotonic() - started
    assert why is not None and f"127.0.0.1:{port}" in why, why
    print(f"closed port answered in {took * 1000:.0f} ms")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert package_index.unreachable(f"http://127.0.0.1:{port}/simple") is None
    assert "not a directory" in (package_index.unreachable("file:///nonexistent/x") or "")
    assert "scheme" in (package_index.unreachable("ftp://x/simple") or "")


def test_a_shared_rebuild_keeps_the_previous_build_only(tmp_path: Path) -> None:
    """Users' sandboxes may still run on the build a rebuild replaces: it stays, older
    ones go, and template.json switches to the new one last."""
    from agent_sandbox.backends.runc.templates.code_interpreter import _commit_shared

    root = tmp_path / "shared"
    _make(root, rootfs="rootfs-a")
    (root / NAME / "rootfs-0").mkdir()  # an older build nobody names any more
    staging = tmp_path / "staging"
    (staging / "rootfs-c" / "opt").mkdir(parents=True)
    new = Template(name=NAME, kind="built", layers=[Layer("/", [str(root / NAME / "rootfs-c")])])
    (staging / "template.json").write_text(json.dumps(new.to_json()))
    _commit_shared(staging, root / NAME, "rootfs-c")
    assert sorted(p.name for p in (root / NAME).iterdir()) == \
        ["rootfs-a", "rootfs-c", "template.json"]
    assert json.loads((root / NAME / "template.json").read_text())["layers"][0]["lowers"] == \
        [str(root / NAME / "rootfs-c")]
