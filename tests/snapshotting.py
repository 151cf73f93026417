"""What the memory-snapshot tests share: whether this host can take snapshots."""

from __future__ import annotations

from typing import Any


def memory_snapshots_missing(engine: Any) -> str | None:
    """None when the engine checkpoints (root, CRIU >= 4.2 passing `criu check`), else why
    not (the tests skip with it; scripts/setup.sh builds CRIU)."""
    from agent_sandbox.backends.runc import criu

    if getattr(engine.backend, "name", "") != "runc":
        return "memory snapshots are the runc engine's"
    return criu.problem() or None
