"""Container images of our templates, for the Kubernetes provider (``abx template push``).

An image is one layer: the template's overlay layers flattened (image_tree), plus the guest
agent at ``/.abx/guest`` and the directories a sandbox needs (``/.abx/run``, ``/workspace``,
``/tmp``), written as a docker-archive tar (image_archive) that ``docker load``, ``ctr
images import`` and ``skopeo copy docker-archive:...`` read.

The layers are self-contained (a local template's, with its host base replaced:
``backends/runc/templates/export.py``); ``providers/push.py`` puts the two together.

The reference defaults to ``abx.local/<template>:<12 hex of the layer digest>``: a changed
template (or guest agent) gets a new reference.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.backends.kubernetes.image_archive import DEFAULT_PATH, write_archive
from agent_sandbox.backends.kubernetes.image_tree import Extra, Flattener
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.templates import Layer, Template

REGISTRY = "abx.local"
GUEST_DIR = ".abx/guest"
GUEST_PORT = 49982
GUEST_COMMAND = ["python3", "-I", "-S", "-X", "utf8", "-c",
                 "import sys; sys.path.insert(0, '/.abx/guest'); import agent; agent.main()",
                 "--tcp", f"0.0.0.0:{GUEST_PORT}"]
# name[:tag] with an optional registry host[:port] and path; or name@sha256:digest.
_REF_RE = re.compile(
    r"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?\Z")

Progress = Callable[[str, int, int], None]  # (step, entries, bytes)


@dataclass(frozen=True)
class ImageBuild:
    template: str
    ref: str
    path: str
    size: int  # bytes of the archive
    layer_size: int
    entries: int
    diff_id: str
    image_id: str
    seconds: float


def check_ref(ref: str) -> str:
    if not isinstance(ref, str) or len(ref) > 255 or not _REF_RE.match(ref):
        raise InvalidArgumentError(
            f"invalid image reference {ref!r}: use [registry/]name[:tag] in lowercase, "
            f"e.g. {REGISTRY}/mytools:v1 or registry.example.com:5000/abx/mytools:v1")
    return ref


def default_ref(template: str, diff_id: str) -> str:
    return f"{REGISTRY}/{template}:{diff_id.split(':', 1)[1][:12]}"


def guest_files() -> dict[str, bytes]:
    """The guest agent's modules (agent_sandbox/guest/*.py), by file name."""
    import agent_sandbox.guest as guest

    folder = Path(guest.__file__).parent
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.py"))}


def extras() -> dict[str, Extra]:
    out = {".abx": Extra(0o755), GUEST_DIR: Extra(0o755, replace=True),
           ".abx/run": Extra(0o755), "workspace": Extra(0o755), "tmp": Extra(0o1777)}
    for name, data in guest_files().items():
        out[f"{GUEST_DIR}/{name}"] = Extra(0o644, data)
    return out


def image_config(template: Template) -> dict[str, object]:
    env = {"PATH": DEFAULT_PATH.split("=", 1)[1], **template.env}
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(template.created_at or 0))
    return {"created": created, "Cmd": list(GUEST_COMMAND), "WorkingDir": template.workdir,
            "Env": [f"{k}={v}" for k, v in env.items()],
            "ExposedPorts": {f"{GUEST_PORT}/tcp": {}},
            "Labels": {"dev.agent-sandbox.template": template.name}}


def required_executables(template: Template) -> list[str]:
    """Paths that must name an executable file in the image: the guest's python3, and the
    kernel's program when the template has a kernel."""
    paths = ["/usr/bin/python3"]
    argv = (template.kernel or {}).get("argv") or []
    if argv and isinstance(argv[0], str) and argv[0].startswith("/"):
        paths.append(argv[0])
    return paths


def write_image(template: Template, layers: list[Layer], out: Path, *, ref: str | None = None,
                progress: Progress | None = None, started: float | None = None) -> ImageBuild:
    """Write the image of ``template`` with these (self-contained) ``layers`` to ``out``."""
    started = time.monotonic() if started is None else started
    name = template.name
    if ref is not None:
        check_ref(ref)
    euid = os.geteuid()
    flat = Flattener([(layer.target, layer.lowers) for layer in layers], extras(),
                     progress=(lambda n, b: progress("writing the image", n, b))
                     if progress else None,
                     owner_as_root=None if euid == 0 else (euid, os.getegid()))
    out.parent.mkdir(parents=True, exist_ok=True)
    info = write_archive(str(out), flat.write,
                         ref if ref is not None else (lambda d: default_ref(name, d)),
                         image_config(template))
    missing = [p for p in required_executables(template) if not _executable(flat, p)]
    if missing:
        out.unlink(missing_ok=True)
        raise InvalidArgumentError(
            f"the image of template {name!r} has no executable {', '.join(missing)} "
            "(the guest agent needs /usr/bin/python3); rebuild the template with it")
    if progress:
        progress("written", len(flat.index), flat.data_bytes)
    return ImageBuild(template=name, ref=info.ref, path=str(out), size=info.size,
                      layer_size=info.layer_size, entries=len(flat.index),
                      diff_id=info.diff_id, image_id=info.config_digest,
                      seconds=time.monotonic() - started)


def _executable(flat: Flattener, path: str) -> bool:
    entry = flat.resolve(path)
    return entry is not None and entry.kind == "file" and bool(entry.mode & 0o111)
