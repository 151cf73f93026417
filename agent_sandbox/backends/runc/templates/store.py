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
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import replace as with_fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.runc.oci import image as oci_image
from agent_sandbox.backends.runc.oci.image import ProgressFn, resolve_in_root
from agent_sandbox.backends.runc.rootfs.checks import check_shell
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.core.templates import BASE, Layer, Template, validate_name
from agent_sandbox.core.validate import is_env_name

if TYPE_CHECKING:
    from agent_sandbox.backends.runc.templates.shared import SharedTemplates

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


class TemplateStore:
    def __init__(self, root: Path, assemble_base: Callable[[Path], Template],
                 shared: SharedTemplates | None = None) -> None:
        self.root = root
        # The host's templates root built for every user (shared_templates.py): used
        # before this store's own copy of the same name.
        self.shared = shared
        # How this host mode makes ``base`` in its folder (template_base.py).
        self._assemble_base = assemble_base
        root.mkdir(parents=True, exist_ok=True)
        # Imported images keep their setuid files and templates their env values: only
        # the engine (root, or the rootless user) reads them, through its own views.
        os.chmod(root, 0o700)
        self._base: Template | None = None
        # One assembly at a time: a warm pool filling and a first create both need base.
        self._base_lock = threading.Lock()
        sweep_leftovers(root)

    def path(self, name: str) -> Path:
        return self.root / validate_name(name)

    def get(self, name: str) -> Template:
        validate_name(name)
        if name == BASE:
            return self.ensure_base()
        shared = self.shared.load(name) if self.shared is not None else None
        if shared is not None:
            composed = self.compose_shared(shared)
            if composed is not None:
                return composed
        meta = self.path(name) / "template.json"
        if not meta.exists():
            known = ", ".join(t.name for t in self.list()) or "none"
            raise NotFoundError(f"template {name!r} not found (available: {known})")
        return Template.from_json(json.loads(meta.read_text()))

    def compose_shared(self, shared: Template) -> Template | None:
        """A shared template (its own layers) on this store's base; None if its tree
        turns out not to be root's alone."""
        assert self.shared is not None
        layers = self.shared.composed(self.ensure_base(), shared, self.root)
        return None if layers is None else with_fields(shared, layers=layers)

    def exists(self, name: str) -> bool:
        return name == BASE or (self.path(name) / "template.json").exists() or (
            self.shared is not None and self.shared.load(name) is not None)

    def list(self) -> list[Template]:
        shared = [t for t in map(self.shared.load, self.shared.names()) if t is not None
                  and t.name != BASE] if self.shared is not None else []
        out = [self.ensure_base(), *shared]  # shared: their own layers (no mirror made)
        seen = {BASE, *(t.name for t in shared)}
        for meta in sorted(self.root.glob("*/template.json")):
            # Dot dirs are imports in progress and removals: never listed.
            name = meta.parent.name
            if name not in seen and not name.startswith("."):
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
            if self.shared is not None and self.shared.load(name) is not None:
                self.shared.remove(name)  # root only; anyone else is told so
                return
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
        check_shell(source)  # before copying a large tree for nothing
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
        if self.shared is not None and self.shared.load(name) is not None:
            raise InvalidArgumentError(f"{name!r} is this host's shared template (in "
                                       f"{self.shared.root}); choose another name")
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
        check_shell(rootfs)
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
            with self._base_lock:
                if self._base is None:
                    self._base = self._assemble_base(self.root / BASE)
        return self._base

    def refresh_base(self) -> None:
        with self._base_lock:
            self._base = self._assemble_base(self.root / BASE)

    def is_base_lower(self, lower: str) -> bool:
        """Whether a template's lower directory is this host's base (the host's /usr,
        /bin..., base's skeleton, any /etc snapshot, today's or an older one)."""
        host = {low for layer in self.ensure_base().layers for low in layer.lowers}
        return (lower in host or lower in _HOST_DIRS
                or Path(lower).is_relative_to(self.root / BASE))


_HOST_DIRS = frozenset({"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"})
_COMMAND_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


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
def sweep_leftovers(root: Path) -> None:
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
