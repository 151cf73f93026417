"""A local template's layers as an image needs them: self-contained.

The local ``base`` is a view of the host's /usr: an image must carry its own. Wherever a
template stands on this host's base (the host's /usr, /bin..., the base's skeleton and /etc
snapshot), the image has the rootless engine's self-contained base instead: a copy of part
of the host's /usr (shells, coreutils, python3, pip, apt; rootless_base) over a merged-/usr
skeleton and the /etc snapshot (secrets masked). It is cached in
``<data dir>/k8s-images/base``.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent_sandbox.backends.runc.templates.base import user_copy_base
from agent_sandbox.backends.runc.templates.store import TemplateStore
from agent_sandbox.core.templates import BASE, Layer, Template


def image_base(data_dir: Path) -> Template:
    """The self-contained base every image stands on (built once per host package set)."""
    folder = data_dir / "k8s-images" / BASE
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder.parent, 0o700)
    return user_copy_base(folder)


def image_layers(store: TemplateStore, template: Template, base: Template) -> list[Layer]:
    """``template``'s layers with this host's base replaced by the image base ``base``."""
    if template.kind == "base":
        return [Layer(layer.target, list(layer.lowers)) for layer in base.layers]
    by_target = {layer.target: layer.lowers for layer in base.layers}
    out: list[Layer] = []
    for layer in template.layers:
        lowers: list[str] = []
        for lower in layer.lowers:
            subs = by_target.get(layer.target, []) if store.is_base_lower(lower) else [lower]
            lowers += [s for s in subs if s not in lowers]
        if lowers:
            out.append(Layer(layer.target, lowers))
    return out


def exported(store: TemplateStore, name: str, data_dir: Path) -> tuple[Template, list[Layer]]:
    """Template ``name`` and its self-contained layers."""
    template = store.get(name)
    return template, image_layers(store, template, image_base(data_dir))
