"""The limits a create gets: what it asked for (checked by ``core.spec``), held to what the
backend can give (``Backend.limit_caps``), else the configured defaults."""

from __future__ import annotations

from agent_sandbox.config.engine import Limits
from agent_sandbox.core import validate
from agent_sandbox.core.spec import CreateSpec

Caps = dict[str, tuple[float, str]]  # option -> (the most one sandbox may have, what it is)


def limits_for(spec: CreateSpec, defaults: Limits, caps: Caps) -> Limits:
    for name, (most, why) in caps.items():
        validate.positive(getattr(spec, name), name, maximum=most, why=why)
    return Limits(memory_mb=spec.memory_mb or defaults.memory_mb,
                  cpu=spec.cpu or defaults.cpu, pids=defaults.pids,
                  disk_mb=spec.disk_mb or defaults.disk_mb)
