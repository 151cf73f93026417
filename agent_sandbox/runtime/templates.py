"""Templates: read-only root filesystems plus the metadata sandboxes start from.

A template is a list of overlay *layers*, each a mount target inside the sandbox and its
lower directories (top first). ``base`` is a view of the host OS: a small skeleton for
``/`` (fresh /tmp /root /home /var), the host's ``/usr`` and the host's ``/etc`` under a
mask layer that hides every secret. User templates carry one layer: their own rootfs.

Imported templates (``import_dir``, ``import_oci``) live in ``<root>/<name>/`` with their
rootfs in a uniquely named ``rootfs-*`` subdirectory: idmapped views are cached by host
path, so a re-imported template must never reuse the path of the one it replaces.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_sandbox.errors import InvalidArgumentError, NotFoundError, RuntimeUnavailableError
from agent_sandbox.runtime import oci_image
from agent_sandbox.runtime.oci_image import ProgressFn, resolve_in_root
from agent_sandbox.runtime.validate import is_env_name

BASE = "base"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_USR_MERGED_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Host files always hidden, whatever their mode.
_ALWAYS_MASKED = ("shadow", "shadow-", "gshadow", "gshadow-", "machine-id")
# Where every sandbox sees the host's /usr, read-only: the guest agent runs from it.
HOST_USR = "/.abx/hostusr"


@dataclass
class Layer:
    target: str
    lowers: list[str]


@dataclass
class Template:
    name: str
    kind: str  # base | dir | oci | built
    layers: list[Layer]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/workspace"
    # Named custom commands: name -> {"cmd": str, "description": str}
    commands: dict[str, dict[str, str]] = field(default_factory=dict)
    # Code-interpreter kernel description (None: the template has no kernel).
    kernel: dict[str, Any] | None = None
    # What it was built from, so an identical rebuild can be skipped.
    build_inputs: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Template:
        # Older metadata also named the template's own python for the guest; the guest
        # now always runs the host's, read-only (a sandbox can rewrite its own /usr).
        data = {k: v for k, v in data.items() if k in _TEMPLATE_FIELDS}
        data["layers"] = [Layer(**layer) for layer in data["layers"]]
        return cls(**data)


_TEMPLATE_FIELDS = frozenset(Template.__dataclass_fields__)


@dataclass
class GuestPython:
    """How to start the guest agent in a template: argv prefix, env, extra mounts."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Meta:
    env: dict[str, str]
    workdir: str
    commands: dict[str, dict[str, str]]
    description: str

    @classmethod
    def of(cls, env: Any, workdir: Any, commands: Any, description: Any) -> _Meta:
        return cls(env=_check_env(env), workdir=_check_workdir(workdir),
                   commands=_check_commands(commands), description=_check_text(description))


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidArgumentError(
            f"invalid template name {name!r}: use 1-63 lowercase letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return name


class TemplateStore:
    def __init__(self, root: Path, *, rootless: bool = False) -> None:
        self.root = root
        # Rootless: base is a user-owned copy of part of the host (rootless_base.py).
        self.rootless = rootless
        root.mkdir(parents=True, exist_ok=True)
        # Imported images keep their setuid files and templates their env values: only
        # the engine (root, or the rootless user) reads them, through its own views.
        os.chmod(root, 0o700)
        self._base: Template | None = None
        _sweep_leftovers(root)

    def path(self, name: str) -> Path:
        return self.root / validate_name(name)

    def get(self, name: str) -> Template:
        validate_name(name)
        if name == BASE:
            return self.ensure_base()
        meta = self.path(name) / "template.json"
        if not meta.exists():
            known = ", ".join(t.name for t in self.list()) or "none"
            raise NotFoundError(f"template {name!r} not found (available: {known})")
        return Template.from_json(json.loads(meta.read_text()))

    def exists(self, name: str) -> bool:
        return name == BASE or (self.path(name) / "template.json").exists()

    def list(self) -> list[Template]:
        out = [self.ensure_base()]
        for meta in sorted(self.root.glob("*/template.json")):
            # Dot dirs are imports in progress and removals: never listed.
            if meta.parent.name != BASE and not meta.parent.name.startswith("."):
                out.append(Template.from_json(json.loads(meta.read_text())))
        return out

    def save(self, template: Template) -> None:
        folder = self.path(template.name)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "template.json.tmp"
        tmp.write_text(json.dumps(template.to_json(), indent=2))
        os.replace(tmp, folder / "template.json")

    def remove(self, name: str) -> None:
        if name == BASE:
            raise InvalidArgumentError("the base template is built in and cannot be removed")
        folder = self.path(name)
        if not (folder / "template.json").exists():
            raise NotFoundError(f"template {name!r} not found")
        # Rename first so a half-deleted template is never listed.
        trash = self.root / f".trash-{name}-{os.getpid()}-{time.time_ns()}"
        os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)

    # imports ---------------------------------------------------------------------------
    def import_dir(self, name: str, source_dir: str | Path, *, env: dict[str, str] | None = None,
                   workdir: str = "/workspace",
                   commands: dict[str, Any] | None = None, description: str = "",
                   progress: ProgressFn | None = None, replace: bool = False) -> Template:
        """A template from a copy of ``source_dir`` (modes, ownership, links kept)."""
        self._check_new(name, replace)
        source = _check_source(Path(source_dir), self.root)
        meta = _Meta.of(env, workdir, commands, description)
        with self._staging(name) as staging:
            rootfs = staging / _rootfs_dirname()
            if progress:
                progress(0, 1, f"copying {source}")
            _copy_tree(source, rootfs)
            if progress:
                progress(1, 1, "copied")
            tmpl = self._describe(name, "dir", rootfs, meta, {"source": str(source)})
            return self._commit(staging, tmpl, replace)

    def import_oci(self, name: str, archive_path: str | Path, *,
                   env: dict[str, str] | None = None, workdir: str | None = None,
                   commands: dict[str, Any] | None = None, description: str = "",
                   ref: str | None = None, progress: ProgressFn | None = None,
                   replace: bool = False) -> Template:
        """A template from an image archive: an OCI layout tarball (``skopeo copy ...
        oci-archive:x.tar``) or a ``docker save`` tarball. The image's Env and WorkingDir
        are the defaults; ``env``/``workdir`` given here win. ``ref`` picks a tag."""
        self._check_new(name, replace)
        archive = Path(archive_path)
        if not archive.is_file():
            raise InvalidArgumentError(f"image archive {str(archive)!r} is not a file")
        user = _Meta.of(env, workdir or "/workspace", commands, description)
        with self._staging(name) as staging:
            rootfs = staging / _rootfs_dirname()
            image = oci_image.unpack_image(archive, rootfs, ref=ref, progress=progress)
            meta = _Meta(env={**image.env, **user.env}, workdir=workdir or image.workdir,
                         commands=user.commands,
                         description=description or _image_description(archive, image))
            inputs = {"archive_sha256": oci_image.file_sha256(archive),
                      "source": str(archive.resolve()), "format": image.format,
                      "ref": ref, "config_digest": image.config_digest,
                      "manifest_digest": image.manifest_digest,
                      "entrypoint": image.entrypoint, "cmd": image.cmd}
            tmpl = self._describe(name, "oci", rootfs, meta, inputs)
            return self._commit(staging, tmpl, replace)

    def import_path(self, name: str, source: str | Path, **kw: Any) -> Template:
        """``import_dir`` for a directory, ``import_oci`` for an archive file."""
        if Path(source).is_dir():
            kw.pop("ref", None)
            return self.import_dir(name, source, **kw)
        return self.import_oci(name, source, **kw)

    def _check_new(self, name: str, replace: bool) -> None:
        validate_name(name)
        if name == BASE:
            raise InvalidArgumentError("'base' is the built-in template; choose another name")
        if not isinstance(replace, bool):
            raise InvalidArgumentError("replace must be true or false")
        if self.exists(name) and not replace:
            raise InvalidArgumentError(f"template {name!r} already exists (pass replace=True "
                                       "to overwrite it)")

    @contextmanager
    def _staging(self, name: str) -> Iterator[Path]:
        """A private dir on the store's filesystem; renamed into place, or deleted."""
        staging = self.root / f".tmp-{name}-{os.getpid()}-{time.time_ns()}"
        staging.mkdir(mode=0o755)
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already after a commit

    def _describe(self, name: str, kind: str, rootfs: Path, meta: _Meta,
                  inputs: dict[str, Any]) -> Template:
        final = self.path(name) / rootfs.name
        _ensure_dir_inside(rootfs, meta.workdir)
        return Template(name=name, kind=kind, layers=[Layer("/", [str(final)])], env=meta.env,
                        workdir=meta.workdir, commands=meta.commands, build_inputs=inputs,
                        description=meta.description)

    def _commit(self, staging: Path, tmpl: Template, replace: bool) -> Template:
        (staging / "template.json").write_text(json.dumps(tmpl.to_json(), indent=2))
        folder = self.path(tmpl.name)
        trash = self.root / f".trash-{tmpl.name}-{os.getpid()}-{time.time_ns()}"
        with open(self.root / ".import.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two importers of one name: one wins
            if (folder / "template.json").exists() and not replace:
                raise InvalidArgumentError(f"template {tmpl.name!r} already exists")
            if folder.exists():  # the replaced template, or a leftover without metadata
                os.replace(folder, trash)
            os.replace(staging, folder)
        shutil.rmtree(trash, ignore_errors=True)
        return tmpl

    # base ------------------------------------------------------------------------------
    def ensure_base(self) -> Template:
        """The base template, assembled once per process; ``refresh_base`` picks up a
        changed host /etc (the engine's reaper calls it every few seconds)."""
        if self._base is None:
            self._base = self._assemble_base()
        return self._base

    def refresh_base(self) -> None:
        self._base = self._assemble_base()

    def _assemble_base(self) -> Template:
        folder = self.root / BASE
        skeleton = folder / "skeleton"
        if not skeleton.exists():
            _build_skeleton(folder, skeleton, merged=self.rootless)
        etc = _ensure_etc_snapshot(folder)
        if self.rootless:
            from agent_sandbox.runtime import rootless_base

            usr = rootless_base.ensure_usr(folder)
            return Template(
                name=BASE, kind="base", created_at=skeleton.stat().st_mtime,
                layers=[Layer("/", [str(skeleton)]), Layer("/usr", [str(usr)]),
                        Layer("/etc", [str(etc)])],
                description="A copy of part of the host OS (shells, coreutils, python3, pip, "
                            "apt) and its /etc (secrets masked), fresh /tmp /root /home /var",
            )
        layers = [Layer("/", [str(skeleton)]), Layer("/usr", ["/usr"]), Layer("/etc", [str(etc)])]
        for name in _USR_MERGED_DIRS:
            host = Path("/") / name
            if host.is_dir() and not host.is_symlink():
                layers.append(Layer(f"/{name}", [str(host)]))
        return Template(
            name=BASE, kind="base", layers=layers, created_at=skeleton.stat().st_mtime,
            description="A view of the host OS: its /usr and /etc (secrets masked), "
                        "fresh /tmp /root /home /var",
        )


def _build_skeleton(folder: Path, skeleton: Path, *, merged: bool = False) -> None:
    """``merged``: /bin, /lib, ... are links into /usr whatever the host does (the
    rootless base copies everything into its /usr)."""
    # Unique per thread and process: a pool thread and a create may both get here.
    tmp = folder / f".skeleton.tmp{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    dirs = {"usr": 0o755, "etc": 0o755, "tmp": 0o1777, "root": 0o700, "home": 0o755,
            "var": 0o755, "var/tmp": 0o1777, "var/lib": 0o755, "var/cache": 0o755,
            "var/log": 0o755, "run": 0o755, "proc": 0o555, "sys": 0o555, "dev": 0o755,
            "workspace": 0o755, "opt": 0o755, "mnt": 0o755, "srv": 0o755, "media": 0o755,
            ".abx": 0o755, ".abx/guest": 0o755, ".abx/run": 0o755}
    for rel, mode in dirs.items():
        (tmp / rel).mkdir(exist_ok=True)
        os.chmod(tmp / rel, mode)
    for name in _USR_MERGED_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), tmp / name)
        elif merged and host.is_dir():
            os.symlink(f"usr/{name}", tmp / name)
        elif host.is_dir():
            (tmp / name).mkdir()
    # dpkg's database makes apt and dpkg work on top of the host's /usr.
    if Path("/var/lib/dpkg").is_dir():
        try:
            shutil.copytree("/var/lib/dpkg", tmp / "var/lib/dpkg", symlinks=True)
        except shutil.Error:
            pass  # a non-root copy misses the root-only lock files: dpkg makes new ones
    try:
        os.replace(tmp, skeleton)
    except OSError:  # someone else finished first: theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)


def _etc_fingerprint(etc: Path) -> tuple[str, list[tuple[str, os.stat_result]]]:
    """What a snapshot would hold (world-readable entries) and a digest of it."""
    entries: list[tuple[str, os.stat_result]] = []
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(etc):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            rel = os.path.relpath(full, etc)
            secret = not stat.S_ISLNK(st.st_mode) and not st.st_mode & stat.S_IROTH
            if secret or rel in _ALWAYS_MASKED:
                if name in dirnames:
                    dirnames.remove(name)  # a private directory: nothing below is shared
                continue
            entries.append((rel, st))
            digest.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0"
                          f"{st.st_uid}\0{st.st_gid}\n".encode())
    return digest.hexdigest()[:12], entries


def _sanitized(path: Path) -> str:
    """/etc/shadow-like file with every password field locked."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(":")
        if len(parts) > 2:
            parts[1] = "*"
            lines.append(":".join(parts))
    return "\n".join(lines) + "\n"


def _ensure_etc_snapshot(folder: Path) -> Path:
    """A copy of the host's /etc holding only what every host user may read.

    A copy, not a live view: a secret created in the host's /etc later can never show
    up in a sandbox. Versioned by a digest of names, modes, sizes and times: a changed
    /etc gives a new snapshot for new sandboxes; running ones keep theirs.
    """
    etc = Path("/etc")
    digest, entries = _etc_fingerprint(etc)
    snapshot = folder / f"etc-{digest}"
    if snapshot.exists():
        return snapshot
    tmp = folder / f".etc.tmp{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    os.chmod(tmp, 0o755)
    # As a plain user the copy is the user's own (root inside its sandboxes).
    own_ids = os.geteuid() == 0
    for rel, st in entries:
        src, dst = etc / rel, tmp / rel
        try:
            if stat.S_ISDIR(st.st_mode):
                dst.mkdir(exist_ok=True)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISREG(st.st_mode):
                shutil.copyfile(src, dst, follow_symlinks=False)
            else:
                continue  # fifos, sockets, devices: not configuration
            if own_ids:
                os.lchown(dst, st.st_uid, st.st_gid)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(dst, stat.S_IMODE(st.st_mode))
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:
            continue  # vanished or unreadable meanwhile: leave it out
    for name, source in (("shadow", "passwd"), ("gshadow", "group")):
        if (etc / name).is_file():
            # The real file when readable (root), else the same names from the public one.
            if os.access(etc / name, os.R_OK):
                text = _sanitized(etc / name)
            else:
                tail = ":::::::" if name == "shadow" else "::"
                text = "".join(line.split(":", 1)[0] + ":*" + tail + "\n" for line in
                               (etc / source).read_text(errors="replace").splitlines()
                               if ":" in line)
            (tmp / name).write_text(text)
            os.chmod(tmp / name, 0o640)
    for name, text in (("hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n"),
                       # slirp4netns' DNS forwarder, for sandboxes with network=True
                       ("resolv.conf", "nameserver 10.0.2.3\n"),
                       ("hostname", "sandbox\n")):
        target = tmp / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.write_text(text)
    try:
        os.replace(tmp, snapshot)
    except OSError:  # another process made the same snapshot first
        shutil.rmtree(tmp, ignore_errors=True)
    return snapshot
_COMMAND_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _check_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(
            is_env_name(k) and isinstance(v, str)
            and "\x00" not in v for k, v in env.items()):
        raise InvalidArgumentError("env must map variable names to strings")
    return dict(env)


def _check_workdir(workdir: Any) -> str:
    if not isinstance(workdir, str) or not workdir.startswith("/") or "\x00" in workdir:
        raise InvalidArgumentError(f"workdir must be an absolute path, got {workdir!r}")
    return os.path.normpath(workdir)


def _check_text(text: Any) -> str:
    if not isinstance(text, str):
        raise InvalidArgumentError("description must be a string")
    return text


def _check_commands(commands: Any) -> dict[str, dict[str, str]]:
    """``{"name": "cmd"}`` or ``{"name": {"cmd": ..., "description": ...}}``, normalised."""
    if commands is None:
        return {}
    if not isinstance(commands, dict):
        raise InvalidArgumentError("commands must map names to commands")
    out: dict[str, dict[str, str]] = {}
    for name, spec in commands.items():
        if not isinstance(name, str) or not _COMMAND_NAME_RE.match(name):
            raise InvalidArgumentError(f"invalid custom command name {name!r}")
        entry = {"cmd": spec, "description": ""} if isinstance(spec, str) else spec
        if (not isinstance(entry, dict) or set(entry) - {"cmd", "description"}
                or not isinstance(entry.get("cmd"), str) or not entry["cmd"].strip()
                or not isinstance(entry.get("description", ""), str)):
            raise InvalidArgumentError(f"custom command {name!r} must be a command string or "
                                       '{"cmd": str, "description": str}')
        out[name] = {"cmd": entry["cmd"], "description": entry.get("description", "")}
    return out


def _check_source(source: Path, store_root: Path) -> Path:
    if not source.is_dir():
        raise InvalidArgumentError(f"template source {str(source)!r} is not a directory")
    real = source.resolve()
    if real == Path("/"):
        raise InvalidArgumentError("refusing to import the host's / as a template "
                                   "(use the built-in 'base' template)")
    store = store_root.resolve()
    if real == store or real in store.parents:
        raise InvalidArgumentError(f"template source {str(real)!r} contains the template store")
    return real


# imports: filesystem ---------------------------------------------------------------------
def _sweep_leftovers(root: Path) -> None:
    """Delete imports and removals a dead process left half done (``.tmp-<name>-<pid>-<ns>``,
    ``.trash-...``); those of live processes are still in use."""
    for path in root.glob(".*-*-*"):
        kind, _, rest = path.name.partition("-")
        parts = rest.rsplit("-", 2)
        if kind not in (".tmp", ".trash") or len(parts) != 3 or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (PermissionError, OverflowError):
            continue


def _rootfs_dirname() -> str:
    return f"rootfs-{time.time_ns():x}"


def _copy_tree(source: Path, dest: Path) -> None:
    """cp -a: modes, ownership, hard and symbolic links, xattrs, sparse files kept.
    Mounts inside ``source`` (a chroot's /proc) are not crossed."""
    proc = subprocess.run(["cp", "-a", "--one-file-system", "--", str(source), str(dest)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise InvalidArgumentError(f"copying {source} failed: {proc.stderr.strip()[-2000:]}")
    _drop_devices(dest)


def _drop_devices(root: Path) -> None:
    """Device nodes are useless under the nodev overlay and /dev is a tmpfs; keep only
    0/0 character devices (overlay whiteouts)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path)
            if (stat.S_ISBLK(mode.st_mode) or stat.S_ISCHR(mode.st_mode)) and mode.st_rdev != 0:
                os.unlink(path)


def _ensure_dir_inside(rootfs: Path, workdir: str) -> None:
    """The workdir must exist for commands to start there (/workspace is a mount)."""
    if workdir == "/workspace":
        return
    target = resolve_in_root(rootfs, workdir)
    if not target.exists():
        target.mkdir(mode=0o755, parents=True)
    elif not target.is_dir():
        raise InvalidArgumentError(f"workdir {workdir!r} is not a directory in the template")


def _image_description(archive: Path, image: oci_image.ImageInfo) -> str:
    text = f"Imported from {archive.name} ({image.format}, {image.architecture or '?'})"
    argv = (image.entrypoint or []) + (image.cmd or [])
    return f"{text}; image command: {shlex.join(argv)}" if argv else text


# the guest interpreter -------------------------------------------------------------------
def host_python() -> GuestPython:
    """The host's python3 seen through a read-only bind of its /usr, started by the
    host's dynamic loader with the host's libraries: it needs nothing from the template,
    not even a libc."""
    exe = Path("/usr/bin/python3")
    real = Path(os.path.realpath(exe))
    loader = Path(os.path.realpath(_elf_interpreter(real)))
    if not _under_usr(real) or not _under_usr(loader):
        raise RuntimeUnavailableError(
            "the guest agent runs on the host's python3, but it or its loader is outside "
            "/usr; install python3 from the distribution (apt-get install python3)")
    libdirs = [str(loader.parent), "/usr/lib"]
    return GuestPython(
        # bin/python3, not python3.X: the template survives a host python upgrade.
        argv=[_in_sandbox(loader), "--library-path",
              ":".join(_in_sandbox(Path(d)) for d in dict.fromkeys(libdirs)), _in_sandbox(exe)],
        env={"PYTHONHOME": HOST_USR},
        mounts=[{"destination": HOST_USR, "type": "bind", "source": "/usr",
                 "options": ["rbind", "nosuid", "nodev", "ro"]}],
    )


def _under_usr(path: Path) -> bool:
    return path.parts[:2] == ("/", "usr")


def _in_sandbox(host_path: Path) -> str:
    return HOST_USR + str(host_path)[len("/usr"):]


def _elf_interpreter(path: Path) -> str:
    """The PT_INTERP (dynamic loader) path of an ELF executable."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF":
            raise RuntimeUnavailableError(f"{path} is not an ELF executable")
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        phoff = struct.unpack_from(order + ("Q" if wide else "I"), head, 0x20 if wide else 0x1C)[0]
        entsize, count = struct.unpack_from(order + "HH", head, 0x36 if wide else 0x2A)
        for i in range(count):
            fh.seek(phoff + i * entsize)
            ph = fh.read(entsize)
            if struct.unpack_from(order + "I", ph, 0)[0] != 3:  # PT_INTERP
                continue
            fmt, off_at, size_at = (order + "Q", 8, 32) if wide else (order + "I", 4, 16)
            offset, size = struct.unpack_from(fmt, ph, off_at)[0], struct.unpack_from(
                fmt, ph, size_at)[0]
            fh.seek(offset)
            return fh.read(size).rstrip(b"\0").decode()
    raise RuntimeUnavailableError(f"{path} is statically linked: no loader to reuse")
