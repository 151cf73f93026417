"""Templates as every backend and surface sees them: a name, the layers of root filesystem
a sandbox starts from (top first, each mounted at a target), and the metadata calls into
the sandbox use (workdir, env, custom commands, the code kernel). Where the layers live
is the backend's: directories on this host, an image in a cluster."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_sandbox.core import code_languages
from agent_sandbox.core.errors import InvalidArgumentError

# One spelling for JSON Schema (``$`` is the end there) and Python (fullmatch).
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
BASE = "base"  # a view of the host OS (a copy of it, rootless)
CODE_INTERPRETER = "code-interpreter-v1"  # base plus Python with a Jupyter kernel


@dataclass
class Layer:
    target: str
    lowers: list[str]


@dataclass
class Template:
    name: str
    kind: str  # base | dir | oci | built | recipe
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
    # Recipe templates: what they were built from, and what a sandbox of theirs runs.
    parent: str = ""
    user: str = ""  # USER: who commands run as by default ("" root)
    start_cmd: str = ""  # CMD/ENTRYPOINT: started in the background at create
    ready_cmd: str = ""  # HEALTHCHECK CMD: create returns once it exits 0
    labels: dict[str, str] = field(default_factory=dict)

    def kernels(self) -> dict[str, dict[str, Any]]:
        """Language -> how its kernel starts: ``kernel``'s own (Python's unless it names
        another) and those under its ``languages``; only those it can start (an argv)."""
        kernel = self.kernel or {}
        specs = {kernel.get("language", code_languages.PYTHON): kernel,
                 **kernel.get("languages", {})}
        return {lang: spec for lang, spec in specs.items()
                if isinstance(spec, dict) and spec.get("argv")}

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


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"invalid template name {name!r}: use 1-63 lowercase letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return name
