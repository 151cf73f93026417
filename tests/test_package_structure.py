"""The package's shape, held by tests: layers that point down, no import cycle counting
every import (inside functions too; only ``TYPE_CHECKING`` imports are left out), no import
of another package's private name, no host-mode branch outside the modes, a backend whose
construction touches nothing. Size is a guard, not a rule."""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "agent_sandbox"
MAX_LINES = 420

# Each layer and what it may import (besides itself). Surfaces (surfaces.*) may import
# each other; no surface imports a backend.
LAYERS: dict[str, set[str]] = {
    "guest": set(),  # stdlib only: it runs inside every sandbox
    "core": {"guest"},
    "config": {"core"},
    "guestlink": {"core", "config", "guest"},
    "service": {"core", "config", "guest", "guestlink"},
    "backends.runc": {"core", "config", "guest", "guestlink", "service"},
    "backends.kubernetes": {"core", "config", "guest", "guestlink", "service"},
    "backends.memory": {"core", "config", "guest", "guestlink", "service"},
    "remote": {"core", "config"},
    "providers": {"core", "config", "service", "backends.runc", "backends.kubernetes",
                  "backends.memory", "remote"},
    "sdk": {"core", "config", "guest", "providers"},
    "surfaces": {"core", "config", "sdk", "providers", "remote"},  # remote: a gateway client
    "": {"sdk", "core"},  # agent_sandbox/__init__.py: the public names
}
# The lifecycle above the host modes: no module here may branch on the mode.
MODE_FREE = ("backends/runc/backend", "backends/runc/sandboxes", "backends/runc/boot",
             "backends/runc/pool", "backends/runc/recovery", "backends/runc/templates/store",
             "backends/runc/rootfs/overlay", "backends/runc/rootfs/disk",
             "backends/runc/oci/bundle", "service/lifecycle", "service/guest_ops",
             "service/code/kernels")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _imports(name: str) -> Iterator[tuple[str, str | None]]:
    """(module of ours, name taken from it or None) for every import in ``name``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in MODULES:
                    target = target.rpartition(".")[0]
                if target:
                    yield target, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    yield f"{base}.{alias.name}", None
                elif base in MODULES:
                    yield base, alias.name


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        graph[name] = {t for t, _ in _imports(name)
                       if t != name and not name.startswith(t + ".")}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return ""
    if parts[0] in ("backends", "surfaces") and len(parts) > 1:
        return "surfaces" if parts[0] == "surfaces" else f"backends.{parts[1]}"
    return parts[0]


def test_no_import_cycle_counting_every_import() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_layers_point_down() -> None:
    wrong = []
    for name in MODULES:
        mine = _layer(name)
        for target, _ in _imports(name):
            theirs = _layer(target)
            if theirs == mine or name.startswith(target + "."):
                continue
            allowed = LAYERS["surfaces" if mine == "surfaces" else mine]
            if theirs not in allowed:
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports that skip or climb a layer: " + ", ".join(sorted(set(wrong)))


def _private_uses(name: str) -> Iterator[tuple[str, str]]:
    """(module, private name) this module takes from a module of ours: imported by name,
    or read as an attribute of a module it imported (``validate._PATTERN``)."""
    aliases: dict[str, str] = {}
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    aliases[alias.asname] = alias.name
    for target, attr in _imports(name):
        if attr:
            yield target, attr
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            yield aliases[node.value.id], node.attr


def test_no_private_name_of_another_package() -> None:
    taken = []
    for name in MODULES:
        package = name.rpartition(".")[0] if MODULES[name].name != "__init__.py" else name
        for target, attr in _private_uses(name):
            home = target if MODULES[target].name == "__init__.py" else target.rpartition(".")[0]
            private = attr.startswith("_") and not attr.startswith("__")
            if private and home != package and not package.startswith(home + "."):
                taken.append(f"{name}: {attr} of {target}")
    assert not taken, "private names taken from another package: " + ", ".join(sorted(taken))


def _generated(path: Path) -> bool:
    """Code generated from .proto files (surfaces/e2b/envd_pb), never edited by hand."""
    with path.open() as f:
        first = f.readline()
    return first.startswith("# Generated from") and "DO NOT EDIT" in first


def test_modules_stay_small() -> None:
    """A guard, not a rule: a long module is worth a look, never a reason to cut one
    concept in two."""
    big = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES and not _generated(p)}
    if big:
        warnings.warn(f"modules over {MAX_LINES} lines (is each still one concept?): {big}",
                      stacklevel=1)


@pytest.mark.parametrize("module", MODE_FREE)
def test_no_host_mode_branch_outside_the_modes(module: str) -> None:
    """No name in the code (comments may explain) asks which mode this is."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg | ast.keyword) and n.arg}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
              for a in n.names}
    asked = sorted(n for n in names if "rootless" in n.lower() or n in ("geteuid", "getuid"))
    assert not asked, f"{module} branches on the host mode: {asked}"


def test_a_backend_is_made_without_touching_anything(tmp_path: Path) -> None:
    from agent_sandbox.backends.runc.backend import RuncBackend
    from agent_sandbox.config.engine import EngineConfig

    data = tmp_path / "nothing-yet"
    backend = RuncBackend(EngineConfig(data_dir=data))
    backend.close()
    assert not data.exists()
