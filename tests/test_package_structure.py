"""The package's shape, held by tests: no import cycle, no module past ~400 lines, no
host-mode branch outside the modes, an engine whose construction touches nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "agent_sandbox"
MAX_LINES = 420
# The lifecycle above the host modes: no module here may branch on the mode.
MODE_FREE = ("engine", "sandboxes", "boot", "pool", "reaper", "recovery", "guest_ops",
             "kernels", "templates", "rootfs", "disk", "oci")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of ours imported when ``name`` is imported (module level, not under
    TYPE_CHECKING, not inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level
                                                      + 1] + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in known:
                        found.add(target)
                    elif base in known:
                        found.add(base)

    visit(ast.parse(path.read_text()).body)
    found.discard(name)
    return found


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(path, name, set(modules)) for name, path in modules.items()}
    # A package importing its own submodules (re-exports) is not a cycle of concern.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    seen: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []
    cycles: list[list[str]] = []

    def walk(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in seen:
                walk(nxt)
        stack.pop()
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            walk(name)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _generated(path: Path) -> bool:
    """Code generated from .proto files (server/e2b/envd_pb), never edited by hand."""
    with path.open() as f:
        first = f.readline()
    return first.startswith("# Generated from") and "DO NOT EDIT" in first


def test_modules_stay_small() -> None:
    big = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES and not _generated(p)}
    assert not big, f"modules over {MAX_LINES} lines (split them by concern): {big}"


@pytest.mark.parametrize("module", MODE_FREE)
def test_no_host_mode_branch_outside_the_modes(module: str) -> None:
    """No name in the code (comments may explain) asks which mode this is."""
    tree = ast.parse((PACKAGE / "runtime" / f"{module}.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg | ast.keyword) and n.arg}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
              for a in n.names}
    asked = sorted(n for n in names if "rootless" in n.lower() or n in ("geteuid", "getuid"))
    assert not asked, f"{module} branches on the host mode: {asked}"


def test_an_engine_is_made_without_touching_anything(tmp_path: Path) -> None:
    from agent_sandbox.runtime.config import EngineConfig
    from agent_sandbox.runtime.engine import Engine

    data = tmp_path / "nothing-yet"
    engine = Engine(EngineConfig(data_dir=data), reaper=False)
    engine.close()
    assert not data.exists()
