"""The image tar of a template (backends/kubernetes/images.py): a tiny template on disk,
flattened and written as a docker-archive; the tar read back. No root, no cluster."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from agent_sandbox.backends.kubernetes import images
from agent_sandbox.backends.runc.templates import export
from agent_sandbox.backends.runc.templates.store import TemplateStore
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.templates import Layer, Template

SECRET = b"host secret: never in an image\n"


def _file(path: Path, data: bytes | str = b"", mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)
    return path


def _rootfs(root: Path, outside: Path) -> tuple[Path, Path, Path]:
    """An upper and a lower lower for /, and a separate /usr layer."""
    upper, lower, usr = root / "upper", root / "lower", root / "usr"
    _file(lower / "etc/motd", "lower motd\n")
    _file(lower / "etc/hidden-by-upper", "lower\n")
    _file(lower / "opt/tool/old.txt", "under an opaque dir\n")
    _file(lower / "usr/bin/shadowed", "hidden by the /usr layer\n", 0o755)
    _file(lower / ".abx/guest/stale.py", "old guest\n")
    _file(upper / "etc/hidden-by-upper", "upper\n")
    _file(upper / "opt/tool/new.txt", "new\n")
    _file(upper / "data/links/plain.txt", "plain\n")
    os.symlink(str(outside), upper / "data/links/abs-out")  # absolute, out of the tree
    os.symlink("../../../../../../" + str(outside).lstrip("/") + "/secret",
               upper / "data/links/rel-out")
    os.symlink(str(outside), upper / "escape")  # a whole directory elsewhere
    _file(usr / "bin/python3.11", "#!/bin/false\n", 0o755)
    os.symlink("python3.11", usr / "bin/python3")
    os.link(usr / "bin/python3.11", usr / "bin/python3.11-hard")
    os.chmod(upper / "data", 0o750)
    return upper, lower, usr


@pytest.fixture()
def tree(tmp_path: Path) -> dict[str, Path]:
    outside = tmp_path / "outside"
    _file(outside / "secret", SECRET)
    upper, lower, usr = _rootfs(tmp_path / "tmpl", outside)
    return {"upper": upper, "lower": lower, "usr": usr, "outside": outside,
            "out": tmp_path / "img" / "tiny.tar"}


def _template(**kw: object) -> Template:
    return Template(name="tiny", kind="dir", layers=[], env={"LANG": "C.UTF-8"},
                    created_at=1.0e9, **kw)  # type: ignore[arg-type]


def _layers(t: dict[str, Path]) -> list[Layer]:
    return [Layer("/", [str(t["upper"]), str(t["lower"])]), Layer("/usr", [str(t["usr"])])]


def _read(path: Path) -> tuple[dict[str, tarfile.TarInfo], dict[str, bytes], dict, dict, bytes]:
    with tarfile.open(path) as outer:
        names = outer.getnames()
        assert names[0] == "layer.tar" and names[-1] == "manifest.json"
        manifest = json.loads(outer.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config = json.loads(outer.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        layer = outer.extractfile("layer.tar").read()  # type: ignore[union-attr]
    members: dict[str, tarfile.TarInfo] = {}
    data: dict[str, bytes] = {}
    with tarfile.open(fileobj=__import__("io").BytesIO(layer)) as inner:
        for m in inner.getmembers():
            assert m.name not in members, f"{m.name} twice"
            members[m.name] = m
            if m.isreg():
                data[m.name] = inner.extractfile(m).read()  # type: ignore[union-attr]
    return members, data, manifest[0], config, layer


def test_layers_flatten_with_symlinks_stored_never_followed(tree: dict[str, Path]) -> None:
    built = images.write_image(_template(), _layers(tree), tree["out"])
    members, data, manifest, config, layer = _read(tree["out"])

    # Names: relative, no escapes, nothing from outside the template.
    for name, m in members.items():
        assert not name.startswith("/") and ".." not in name.split("/"), name
        assert m.isdir() or m.isreg() or m.issym() or m.islnk(), name
    assert SECRET not in layer
    assert not any(n.startswith(("escape/", "data/links/abs-out/")) for n in members)
    assert members["escape"].issym() and members["escape"].linkname == str(tree["outside"])
    assert members["data/links/abs-out"].linkname == str(tree["outside"])
    assert members["data/links/rel-out"].linkname.endswith("/secret")
    assert members["data/links/rel-out"].issym()

    # Overlay: upper lowers win, directories merge, a deeper layer hides the parent's.
    assert data["etc/hidden-by-upper"] == b"upper\n"
    assert data["etc/motd"] == b"lower motd\n"
    assert {"opt/tool/new.txt", "opt/tool/old.txt"} <= set(members)
    assert "usr/bin/shadowed" not in members
    assert members["usr/bin/python3"].linkname == "python3.11"
    assert members["usr/bin/python3.11-hard"].islnk()
    assert members["usr/bin/python3.11-hard"].linkname == "usr/bin/python3.11"

    # Modes and owners: kept from the template; the guest and required dirs are ours.
    assert stat.S_IMODE(members["data"].mode) == 0o750
    assert stat.S_IMODE(members["usr/bin/python3.11"].mode) == 0o755
    assert members["etc/motd"].uid == 0 and members["etc/motd"].gid == 0
    guest = {n for n in members if n.startswith(".abx/guest/")}
    assert guest == {f".abx/guest/{n}" for n in images.guest_files()}
    assert ".abx/guest/stale.py" not in members  # the template's guest dir is replaced
    assert ".abx/guest/agent.py" in guest
    for name in guest:
        assert members[name].mode == 0o644 and members[name].uid == 0
    assert members[".abx/guest"].mode == 0o755 and members[".abx/guest"].isdir()
    assert members["tmp"].mode == 0o1777 and members["tmp"].isdir()
    assert members["workspace"].isdir() and members[".abx/run"].isdir()

    # The archive: the layer's digest, the default reference from it, the config.
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    assert config["rootfs"]["diff_ids"] == [diff_id] and built.diff_id == diff_id
    assert manifest["RepoTags"] == [f"abx.local/tiny:{diff_id[7:19]}"] == [built.ref]
    assert config["config"]["WorkingDir"] == "/workspace"
    assert "LANG=C.UTF-8" in config["config"]["Env"]
    assert config["config"]["Cmd"][:2] == ["python3", "-I"]
    assert built.size == tree["out"].stat().st_size


def test_same_template_same_reference(tree: dict[str, Path]) -> None:
    first = images.write_image(_template(), _layers(tree), tree["out"])
    again = images.write_image(_template(), _layers(tree), tree["out"].with_name("b.tar"))
    assert first.ref == again.ref and first.image_id == again.image_id
    _file(tree["upper"] / "etc/new", "changed\n")
    changed = images.write_image(_template(), _layers(tree), tree["out"])
    assert changed.ref != first.ref


def test_opaque_directory_hides_lower_contents(tree: dict[str, Path]) -> None:
    try:
        os.setxattr(tree["upper"] / "opt/tool", "user.overlay.opaque", b"y")
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM):
            pytest.skip(f"this filesystem has no user xattrs ({exc.strerror})")
        raise
    images.write_image(_template(), _layers(tree), tree["out"])
    members = _read(tree["out"])[0]
    assert "opt/tool/new.txt" in members and "opt/tool/old.txt" not in members


@pytest.mark.skipif(os.geteuid() != 0, reason="making an overlay whiteout (a 0/0 character "
                    "device) needs root")
def test_whiteout_hides_lower_entry_and_is_not_stored(tree: dict[str, Path]) -> None:
    os.mknod(tree["upper"] / "etc/motd", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    images.write_image(_template(), _layers(tree), tree["out"])
    members = _read(tree["out"])[0]
    assert "etc/motd" not in members and "etc/hidden-by-upper" in members
    assert not any(m.ischr() or m.isblk() for m in members.values())


def test_an_explicit_reference_is_checked_and_used(tree: dict[str, Path]) -> None:
    ref = "registry.example.com:5000/abx/tiny:v1"
    assert images.write_image(_template(), _layers(tree), tree["out"], ref=ref).ref == ref
    assert _read(tree["out"])[2]["RepoTags"] == [ref]
    for bad in ("Tiny:v1", "a b", "x:", "/x", "x:" + "t" * 200):
        with pytest.raises(InvalidArgumentError, match="invalid image reference"):
            images.check_ref(bad)


def test_missing_python_or_kernel_is_refused_and_nothing_left(tree: dict[str, Path]) -> None:
    os.unlink(tree["usr"] / "bin/python3.11")
    os.unlink(tree["usr"] / "bin/python3.11-hard")
    with pytest.raises(InvalidArgumentError, match="/usr/bin/python3"):
        images.write_image(_template(), _layers(tree), tree["out"])
    assert not tree["out"].exists() and list(tree["out"].parent.iterdir()) == []
    _file(tree["usr"] / "bin/python3.11", "#!/bin/false\n", 0o755)
    kernel = {"argv": ["/opt/venv/bin/python", "-m", "ipykernel_launcher"]}
    with pytest.raises(InvalidArgumentError, match="/opt/venv/bin/python"):
        images.write_image(_template(kernel=kernel), _layers(tree), tree["out"])
    _file(tree["lower"] / "opt/venv/bin/python3", "#!/bin/false\n", 0o755)
    os.symlink("/usr/bin/python3", tree["lower"] / "opt/venv/bin/python")  # as a venv's
    os.symlink("python3", tree["lower"] / "opt/venv/bin/python-rel")
    images.write_image(_template(kernel=kernel), _layers(tree), tree["out"])


def test_host_base_parts_are_replaced_by_the_image_base(tmp_path: Path) -> None:
    """Lowers of this host's base (its /usr view, skeleton, /etc snapshot) become the image
    base's; the template's own stay on top."""
    skeleton, etc = tmp_path / "store/base/skeleton", tmp_path / "store/base/etc-1"

    def host_base(folder: Path) -> Template:
        return Template(name="base", kind="base", layers=[
            Layer("/", [str(skeleton)]), Layer("/usr", ["/usr"]), Layer("/etc", [str(etc)]),
            Layer("/bin", ["/bin"])])

    store = TemplateStore(tmp_path / "store", host_base)
    own = str(tmp_path / "store/mine/rootfs-1")
    tmpl = Template(name="mine", kind="dir", layers=[
        Layer("/", [own, str(skeleton)]), Layer("/usr", ["/usr"]),
        Layer("/etc", [str(tmp_path / "store/base/etc-0-stale")]), Layer("/bin", ["/bin"])])
    image_base = Template(name="base", kind="base", layers=[
        Layer("/", ["/img/skel"]), Layer("/usr", ["/img/usr"]), Layer("/etc", ["/img/etc"])])
    got = export.image_layers(store, tmpl, image_base)
    assert [(la.target, la.lowers) for la in got] == [
        ("/", [own, "/img/skel"]), ("/usr", ["/img/usr"]), ("/etc", ["/img/etc"])]
    assert export.image_layers(store, store.get("base"), image_base) == image_base.layers
