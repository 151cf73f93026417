"""Imported templates: directories and image archives, run as real sandboxes."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.backends.runc.host.guest_python import HOST_USR
from agent_sandbox.backends.runc.templates.store import TemplateStore
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, WrongStateError
from agent_sandbox.providers.local import local_provider
from agent_sandbox.service.service import SandboxService

_BUSYBOX = Path("/bin/busybox")
_APPLETS = ("sh", "ls", "cat", "echo", "pwd", "test", "tr", "id", "stat")

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not _BUSYBOX.exists() or
                                subprocess.run([str(_BUSYBOX), "--help"],
                                               capture_output=True).returncode != 0,
                                reason="needs a static busybox (apt-get install busybox-static)")]


# ---- fixtures: rootfs trees ------------------------------------------------------------
def _busybox_rootfs(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    shutil.copy2(_BUSYBOX, root / "bin" / "busybox")
    for applet in _APPLETS:
        os.symlink("busybox", root / "bin" / applet)
    return root


def _shared_libs(path: str) -> set[str]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        words = line.split()
        for word in words:
            if word.startswith("/"):
                found.add(word)
                break
    return found


def _python_rootfs(root: Path) -> Path:
    """Busybox plus the host's python3 with just the libraries it links."""
    _busybox_rootfs(root)
    (root / "usr" / "bin").mkdir(parents=True)
    for name in ("lib", "lib64"):
        (root / "usr" / name).mkdir()
        os.symlink(f"usr/{name}", root / name)
    python = os.path.realpath("/usr/bin/python3")
    stdlib = Path(python.replace("/bin/", "/lib/"))
    shutil.copytree(stdlib, root / stdlib.relative_to("/"), symlinks=True,
                    ignore=shutil.ignore_patterns("test", "dist-packages", "__pycache__",
                                                  "idlelib", "tkinter", "ensurepip"))
    binaries = [python, *map(str, (stdlib / "lib-dynload").glob("*.so"))]
    libs = set().union(*map(_shared_libs, binaries))
    for lib in libs:
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)
    shutil.copy2(python, root / python.lstrip("/"))
    os.symlink(Path(python).name, root / "usr/bin/python3")
    return root


@pytest.fixture(scope="module")
def engine() -> SandboxService:
    return local_provider()


@pytest.fixture(scope="module")
def store(engine: SandboxService) -> TemplateStore:
    return engine.backend.templates


@pytest.fixture
def name() -> Iterator[str]:
    """A fresh template name, removed after the test if it still exists."""
    chosen = f"t-{uuid.uuid4().hex[:10]}"
    yield chosen
    store = local_provider().backend.templates
    if store.exists(chosen):
        store.remove(chosen)


# ---- fixtures: image archives ----------------------------------------------------------
def _tar_bytes(add: Any) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        add(tf)
    return buf.getvalue()


def _file(tf: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tf.addfile(info, io.BytesIO(data))


def _entry(tf: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o755
    tf.addfile(info)


def _image_layers(tmp: Path) -> list[bytes]:
    """Layer 1: busybox and three files; layer 2 whites one out and makes /opq opaque."""
    rootfs = _busybox_rootfs(tmp / "layer1")

    def layer1(tf: tarfile.TarFile) -> None:
        tf.add(rootfs, arcname=".")
        _entry(tf, "data", tarfile.DIRTYPE)
        _file(tf, "data/keep.txt", b"from layer 1\n")
        _file(tf, "data/gone.txt", b"must disappear\n")
        _entry(tf, "opq", tarfile.DIRTYPE)
        _file(tf, "opq/old.txt", b"lower\n")

    def layer2(tf: tarfile.TarFile) -> None:
        _file(tf, "data/.wh.gone.txt")
        _entry(tf, "opq", tarfile.DIRTYPE)
        _file(tf, "opq/.wh..wh..opq")
        _file(tf, "opq/new.txt", b"upper\n")

    return [_tar_bytes(layer1), _tar_bytes(layer2)]


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _config(layers: list[bytes]) -> bytes:
    return json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin", "FOO=from-image"], "WorkingDir": "/app",
                   "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "echo hi"]},
        "rootfs": {"type": "layers", "diff_ids": [_sha(x) for x in layers]},
    }).encode()


def _write_archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tf:
        for member, data in members.items():
            _file(tf, member, data)
    return path


def _oci_archive(path: Path, layers: list[bytes], *, corrupt: bool = False) -> Path:
    """An OCI layout tarball (gzip layers) whose index also lists an arm64 image."""
    blobs = [gzip.compress(x, mtime=0) for x in layers]
    config = _config(layers)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _sha(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _sha(b), "size": len(b)} for b in blobs],
    }).encode()
    other = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": "sha256:" + "0" * 64, "size": 1,
             "platform": {"os": "linux", "architecture": "arm64"}}
    index = json.dumps({"schemaVersion": 2, "manifests": [other, {
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _sha(manifest),
        "size": len(manifest), "platform": {"os": "linux", "architecture": "amd64"},
        "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}).encode()
    members = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
    for blob in (config, manifest, *blobs):
        members[f"blobs/sha256/{_sha(blob)[7:]}"] = blob
    if corrupt:
        key = f"blobs/sha256/{_sha(blobs[-1])[7:]}"
        members[key] = gzip.compress(layers[-1] + b"\0" * 512, mtime=0)
    return _write_archive(path, members)


def _docker_archive(path: Path, layers: list[bytes]) -> Path:
    """``docker save`` layout: uncompressed layers, config named by its digest."""
    config = _config(layers)
    names = [f"{_sha(x)[7:]}/layer.tar" for x in layers]
    manifest = [{"Config": f"{_sha(config)[7:]}.json", "RepoTags": ["demo:latest"],
                 "Layers": names}]
    members = {"manifest.json": json.dumps(manifest).encode(),
               f"{_sha(config)[7:]}.json": config}
    members.update(zip(names, layers, strict=True))
    return _write_archive(path, members)


# ---- directory templates ---------------------------------------------------------------
def test_dir_template_with_python(store: TemplateStore, name: str, tmp_path: Path) -> None:
    src = _python_rootfs(tmp_path / "src")
    (src / "srv").mkdir()
    (src / "srv" / "owned").write_text("x")
    os.chown(src / "srv" / "owned", 1234, 1234)
    store.import_dir(name, src, env={"FOO": "bar"}, workdir="/srv",
                     description="python rootfs")
    with Sandbox.create(template=name) as sb:
        result = sb.commands.run("echo $FOO; pwd; stat -c %u /srv/owned; "
                                 "cat /proc/1/cmdline | tr '\\0' ' '")
        assert result.exit_code == 0, result.stderr
        foo, cwd, owner, cmdline = result.stdout.splitlines()
        assert (foo, cwd, owner) == ("bar", "/srv", "1234")
        # The guest runs the host's python from a read-only mount, never the template's
        # (which the sandbox can rewrite); the template's python3 is the user's.
        assert cmdline.startswith(HOST_USR + "/") and " -I -S " in cmdline
        assert sb.commands.run("command -v python3").stdout == "/usr/bin/python3\n"
        denied = sb.commands.run(f"touch {HOST_USR}/bin/x")
        assert denied.exit_code != 0 and "Read-only" in denied.stderr


def test_busybox_template_uses_host_python(store: TemplateStore, name: str,
                                           tmp_path: Path) -> None:
    tmpl = store.import_dir(name, _busybox_rootfs(tmp_path / "bb"))
    assert not (Path(tmpl.layers[0].lowers[0]) / "lib").exists()  # no libc at all
    with Sandbox.create(template=name) as sb:
        result = sb.commands.run("echo hi; id -u; ls /bin/busybox")
        assert (result.exit_code, result.stdout) == (0, "hi\n0\n/bin/busybox\n")
        sb.files.write("/workspace/f.txt", "data")
        assert sb.commands.run("cat /workspace/f.txt").stdout == "data"


def test_custom_commands_list_and_remove(engine: SandboxService, store: TemplateStore, name: str,
                                         tmp_path: Path) -> None:
    commands = {"greet": {"cmd": "echo hello", "description": "says hello"},
                "short": "echo short"}
    store.import_dir(name, _busybox_rootfs(tmp_path / "bb"), commands=commands)
    tmpl = store.get(name)
    assert tmpl.commands == {"greet": {"cmd": "echo hello", "description": "says hello"},
                             "short": {"cmd": "echo short", "description": ""}}
    assert name in [t.name for t in engine.list_templates()]
    with Sandbox.create(template=name) as sb:
        assert sb.custom("greet", ["big world"]).stdout == "hello big world\n"
        with pytest.warns(DeprecationWarning):
            assert sb.run_command("short").stdout == "short\n"
    folder = store.path(name)
    engine.backend.remove_template(name)
    assert not folder.exists()
    assert name not in [t.name for t in store.list()]
    with pytest.raises(NotFoundError, match="available: .*base"):
        Sandbox.create(template=name)


def test_import_dir_refusals(store: TemplateStore, name: str, tmp_path: Path) -> None:
    src = _busybox_rootfs(tmp_path / "bb")
    for bad in ("Bad", "", "../x", "a/b", "x" * 64, "base"):
        with pytest.raises(InvalidArgumentError):
            store.import_dir(bad, src)
    for source in ("/", tmp_path / "missing", src / "bin" / "busybox"):
        with pytest.raises(InvalidArgumentError):
            store.import_dir(name, source)
    with pytest.raises(InvalidArgumentError):
        store.import_dir(name, src, commands={"x": {"cmd": 1}})
    with pytest.raises(InvalidArgumentError):
        store.import_dir(name, src, workdir="relative")
    first = store.import_dir(name, src, env={"V": "1"})
    with pytest.raises(InvalidArgumentError, match="already exists"):
        store.import_dir(name, src)
    second = store.import_dir(name, src, env={"V": "2"}, replace=True)
    assert store.get(name).env == {"V": "2"}
    assert first.layers[0].lowers != second.layers[0].lowers  # fresh idmap view
    assert not Path(first.layers[0].lowers[0]).exists()
    assert not [p for p in store.root.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_leftovers_of_dead_importers_are_swept(store: TemplateStore) -> None:
    dead = store.root / ".tmp-x-999999999-1"
    live = store.root / f".tmp-y-{os.getpid()}-1"
    for path in (dead, live):
        (path / "rootfs").mkdir(parents=True)
    TemplateStore(store.root, lambda folder: store.ensure_base())
    assert not dead.exists() and live.exists()
    shutil.rmtree(live)


# ---- image archives --------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["oci", "docker"])
def test_image_archive(store: TemplateStore, name: str, tmp_path: Path, fmt: str) -> None:
    layers = _image_layers(tmp_path)
    build = _oci_archive if fmt == "oci" else _docker_archive
    archive = build(tmp_path / "image.tar", layers)
    calls: list[tuple[int, int, str]] = []
    tmpl = store.import_oci(name, archive, env={"EXTRA": "1"},
                            progress=lambda *a: calls.append(a))
    assert tmpl.kind == "oci" and tmpl.workdir == "/app"
    assert tmpl.env == {"PATH": "/bin", "FOO": "from-image", "EXTRA": "1"}
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert tmpl.build_inputs["archive_sha256"] == digest
    assert tmpl.build_inputs["cmd"] == ["-c", "echo hi"] and "/bin/sh" in tmpl.description
    assert len(calls) == 3 and calls[-1][0] == calls[-1][1] > 0
    with Sandbox.create(template=name) as sb:
        result = sb.commands.run("pwd; echo $FOO; cat /data/keep.txt; ls /data; ls /opq")
        assert result.exit_code == 0, result.stderr
        assert result.stdout.splitlines() == ["/app", "from-image", "from layer 1",
                                              "keep.txt", "new.txt"]


def test_image_archive_digest_mismatch(store: TemplateStore, name: str, tmp_path: Path) -> None:
    archive = _oci_archive(tmp_path / "bad.tar", _image_layers(tmp_path), corrupt=True)
    with pytest.raises(InvalidArgumentError, match="digest mismatch"):
        store.import_oci(name, archive)
    assert not store.exists(name)


def _hostile(tf: tarfile.TarFile, member: str) -> None:
    if member == "dotdot":
        _file(tf, "../../etc/evil-abx", b"escaped")
    elif member == "absolute":
        _file(tf, "/etc/evil-abx", b"escaped")
    elif member == "hardlink":
        _entry(tf, "passwd", tarfile.LNKTYPE, "/etc/passwd")


@pytest.mark.parametrize("member", ["dotdot", "absolute", "hardlink"])
def test_hostile_members_refused(store: TemplateStore, name: str, tmp_path: Path,
                                 member: str) -> None:
    layer = _tar_bytes(lambda tf: _hostile(tf, member))
    archive = _docker_archive(tmp_path / "evil.tar", [layer])
    with pytest.raises(InvalidArgumentError, match="refusing"):
        store.import_oci(name, archive)
    assert not Path("/etc/evil-abx").exists()
    assert not (store.root / "etc").exists() and not store.exists(name)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]


def test_symlink_escapes_neutralised(store: TemplateStore, name: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shell = _busybox_rootfs(tmp_path / "sh")

    def layer(tf: tarfile.TarFile) -> None:
        tf.add(shell, arcname=".")  # a template needs its /bin/sh
        _entry(tf, "esc", tarfile.SYMTYPE, str(outside))
        _file(tf, "esc/evil", b"x")
        _entry(tf, "up", tarfile.SYMTYPE, "../../../../../..")
        _file(tf, "up/evil2", b"y")
        _entry(tf, "dev-sda", tarfile.BLKTYPE)

    archive = _docker_archive(tmp_path / "links.tar", [_tar_bytes(layer)])
    tmpl = store.import_oci(name, archive)
    assert list(outside.iterdir()) == []
    assert not (store.root.parent / "evil2").exists()
    rootfs = Path(tmpl.layers[0].lowers[0])
    assert (rootfs / str(outside).lstrip("/") / "evil").read_bytes() == b"x"
    assert (rootfs / "evil2").read_bytes() == b"y"
    assert os.readlink(rootfs / "esc") == str(outside)
    assert not (rootfs / "dev-sda").exists()


def _umoci_image(work: Path) -> Path:
    """A two-layer OCI layout made by umoci; layer 2 deletes a file of layer 1."""
    def run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, cwd=work)

    run("umoci", "init", "--layout", "img")
    run("umoci", "new", "--image", "img:t")
    for step in (1, 2):
        run("umoci", "unpack", "--image", "img:t", "bundle")
        rootfs = work / "bundle" / "rootfs"
        if step == 1:
            _busybox_rootfs(rootfs)
            (rootfs / "one").write_text("1\n")
            (rootfs / "gone").write_text("x")
        else:
            (rootfs / "gone").unlink()
        run("umoci", "repack", "--image", "img:t", "bundle")
        shutil.rmtree(work / "bundle")
    run("umoci", "config", "--image", "img:t", "--config.env", "FOO=umoci",
        "--config.workingdir", "/w")
    return work / "img"


@pytest.mark.skipif(not (shutil.which("umoci") and shutil.which("skopeo")),
                    reason="needs umoci and skopeo")
@pytest.mark.parametrize("dest", ["oci-archive", "docker-archive"])
def test_skopeo_written_archives(store: TemplateStore, name: str, tmp_path: Path,
                                 dest: str) -> None:
    layout = _umoci_image(tmp_path)
    archive = tmp_path / "image.tar"
    subprocess.run(["skopeo", "copy", "-q", f"oci:{layout}:t", f"{dest}:{archive}"],
                   check=True, capture_output=True)
    tmpl = store.import_oci(name, archive)
    assert (tmpl.env["FOO"], tmpl.workdir) == ("umoci", "/w")
    with Sandbox.create(template=name) as sb:
        result = sb.commands.run("pwd; cat /one; test -e /gone || echo gone")
        assert result.stdout.splitlines() == ["/w", "1", "gone"]


def test_engine_import_replace_and_remove_guard_sandboxes(engine: SandboxService, name: str,
                                                         tmp_path: Path) -> None:
    src = _busybox_rootfs(tmp_path / "bb")
    info = engine.backend.import_template(name, str(src), description="tiny")
    assert info.name == name and name in {t.name for t in engine.list_templates()}
    with Sandbox.create(template=name) as sb:
        with pytest.raises(WrongStateError, match="kill them first"):
            engine.backend.import_template(name, str(src), replace=True)
        with pytest.raises(WrongStateError, match="kill them first"):
            engine.backend.remove_template(name)
        assert sb.commands.run("echo still").stdout == "still\n"
    engine.backend.remove_template(name)
    assert name not in {t.name for t in engine.list_templates()}


def test_template_metadata_reaches_live_sandboxes_within_the_reuse_window(
        store: TemplateStore, name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls to a live sandbox reuse its template's metadata for TEMPLATE_REUSE seconds
    (a shared template's checks cost ~50 us a call), then see a change."""
    from dataclasses import replace

    from agent_sandbox.service import access

    monkeypatch.setattr(access, "TEMPLATE_REUSE", 3600.0)  # however slow the host is
    tmpl = store.import_dir(name, _busybox_rootfs(tmp_path / "bb"), env={"FOO": "one"})
    with Sandbox.create(template=name) as sb:
        assert sb.commands.run("echo $FOO").stdout == "one\n"
        store.save(replace(tmpl, env={"FOO": "two"}))
        assert sb.commands.run("echo $FOO").stdout == "one\n"  # within the window
        # The window over (its clock moved on, not the test's: no timing to race).
        later = time.monotonic() + access.TEMPLATE_REUSE + 1
        monkeypatch.setattr(access, "time", SimpleNamespace(monotonic=lambda: later))
        assert sb.commands.run("echo $FOO").stdout == "two\n"
