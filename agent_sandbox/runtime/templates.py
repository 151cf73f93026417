"""Templates: read-only root filesystems plus the metadata sandboxes start from.

A template is a list of overlay *layers*, each a mount target inside the sandbox and its
lower directories (top first). ``base`` is a view of the host OS: a small skeleton for
``/`` (fresh /tmp /root /home /var), the host's ``/usr`` and the host's ``/etc`` under a
mask layer that hides every secret. User templates carry one layer: their own rootfs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_sandbox.errors import InvalidArgumentError, NotFoundError

BASE = "base"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_USR_MERGED_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Host files always hidden, whatever their mode.
_ALWAYS_MASKED = ("shadow", "shadow-", "gshadow", "gshadow-", "machine-id")


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
    # How to start the guest: argv prefix and extra environment.
    python: list[str] = field(default_factory=lambda: ["/usr/bin/python3"])
    python_env: dict[str, str] = field(default_factory=dict)
    # Extra mounts (OCI mount dicts) the guest needs, e.g. the host interpreter.
    mounts: list[dict[str, Any]] = field(default_factory=list)
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
        data = dict(data)
        data["layers"] = [Layer(**layer) for layer in data["layers"]]
        return cls(**data)


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidArgumentError(
            f"invalid template name {name!r}: use 1-63 lowercase letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return name


class TemplateStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._base: Template | None = None

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
            if meta.parent.name != BASE:
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

    # base ------------------------------------------------------------------------------
    def ensure_base(self) -> Template:
        """The base template, assembled once per process (its /etc mask is re-checked
        at every engine start, so a new host secret is masked from then on)."""
        if self._base is None:
            self._base = self._assemble_base()
        return self._base

    def _assemble_base(self) -> Template:
        folder = self.root / BASE
        skeleton = folder / "skeleton"
        if not skeleton.exists():
            _build_skeleton(folder, skeleton)
        mask = _ensure_etc_mask(folder)
        layers = [Layer("/", [str(skeleton)]), Layer("/usr", ["/usr"]),
                  Layer("/etc", [str(mask), "/etc"])]
        for name in _USR_MERGED_DIRS:
            host = Path("/") / name
            if host.is_dir() and not host.is_symlink():
                layers.append(Layer(f"/{name}", [str(host)]))
        return Template(
            name=BASE, kind="base", layers=layers, created_at=skeleton.stat().st_mtime,
            description="A view of the host OS: its /usr and /etc (secrets masked), "
                        "fresh /tmp /root /home /var",
        )


def _build_skeleton(folder: Path, skeleton: Path) -> None:
    tmp = folder / f"skeleton.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
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
        elif host.is_dir():
            (tmp / name).mkdir()
    # dpkg's database makes apt and dpkg work on top of the host's /usr.
    if Path("/var/lib/dpkg").is_dir():
        shutil.copytree("/var/lib/dpkg", tmp / "var/lib/dpkg", symlinks=True)
    os.replace(tmp, skeleton)


def _secret_files(etc: Path) -> list[str]:
    """Relative paths under /etc that others may not read: treated as secrets."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(etc):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            rel = os.path.relpath(full, etc)
            if stat.S_ISLNK(st.st_mode):
                continue
            if not st.st_mode & stat.S_IROTH or rel in _ALWAYS_MASKED:
                found.append(rel)
                if name in dirnames:
                    dirnames.remove(name)
    return sorted(found)


def _sanitized(path: Path) -> str:
    """/etc/shadow-like file with every password field locked."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(":")
        if len(parts) > 2:
            parts[1] = "*"
            lines.append(":".join(parts))
    return "\n".join(lines) + "\n"


def _ensure_etc_mask(folder: Path) -> Path:
    """The layer over host /etc: whiteouts for secrets, our hosts/resolv.conf/hostname.

    Versioned by content: when the host's secrets change, a new mask appears and running
    sandboxes keep the one they were mounted with.
    """
    etc = Path("/etc")
    secrets = _secret_files(etc)
    digest = hashlib.sha256("\n".join(secrets).encode()).hexdigest()[:12]
    mask = folder / f"etc-mask-{digest}"
    if mask.exists():
        return mask
    tmp = folder / f"etc-mask.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for rel in secrets:
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in ("shadow", "gshadow") and (etc / rel).is_file():
            target.write_text(_sanitized(etc / rel))
            os.chmod(target, 0o640)
        else:
            os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))  # overlay whiteout
    (tmp / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n")
    # slirp4netns' DNS forwarder, used only by sandboxes created with network=True.
    (tmp / "resolv.conf").write_text("nameserver 10.0.2.3\n")
    (tmp / "hostname").write_text("sandbox\n")
    for leftover in folder.glob("etc-mask.tmp*"):
        if leftover != tmp:
            shutil.rmtree(leftover, ignore_errors=True)
    os.replace(tmp, mask)
    return mask
