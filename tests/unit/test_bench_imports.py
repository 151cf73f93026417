"""The benchmarks (run by hand, never by the suite) name only what the package has: every
``agent_sandbox`` import in bench/, at the top or inside a function, resolves."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_every_package_import_of_the_benchmarks_resolves() -> None:
    missing = []
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wanted = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                wanted = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in wanted:
                if not module.startswith("agent_sandbox"):
                    continue
                try:
                    found = importlib.import_module(module)
                except ImportError:
                    missing.append(f"{path.name}:{node.lineno}: {module}")
                    continue
                if name is not None and not hasattr(found, name):
                    try:
                        importlib.import_module(f"{module}.{name}")
                    except ImportError:
                        missing.append(f"{path.name}:{node.lineno}: {module}.{name}")
    assert not missing, "bench/ imports what the package lacks: " + ", ".join(missing)


def test_the_create_profiles_steps_name_functions_the_package_has() -> None:
    """bench/create_profile.py wraps engine functions named by strings: each must exist."""
    steps = []
    tree = ast.parse((BENCH / "create_profile.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "STEPS":
            steps = ast.literal_eval(node.value)
    assert steps, "create_profile.py has no STEPS"
    missing = []
    for _label, module, attr in steps:
        owner = importlib.import_module(module)
        for part in attr.split("."):
            owner = getattr(owner, part, None)
        if owner is None:
            missing.append(f"{module}.{attr}")
    assert not missing, "create_profile.py times what the package lacks: " + ", ".join(missing)
