"""The reaper's decisions and the warm pool's policy: pure functions of a sandbox's record
and the time, the same for every backend (each acts on them in its own way)."""

from __future__ import annotations

from enum import Enum

from agent_sandbox.config.engine import EngineConfig, Limits
from agent_sandbox.core.spec import CreateSpec
from agent_sandbox.core.states import VISIBLE, SandboxState
from agent_sandbox.service.record import SandboxRecord


class Step(Enum):
    """What the reaper does to a sandbox; the value says why (the audit log's words)."""

    PAUSE = "idle past its timeout"  # frozen, its files kept
    RELEASE = "paused for long"  # its processes end, its disk stays
    END_LIFETIME = "its lifetime is over"  # killed, busy or not
    END_IDLE = "idle past its timeout (on_timeout: kill)"
    END_AGE = "paused and unused past the operator's maximum age (ABX_PAUSED_MAX_AGE)"

    @property
    def ends(self) -> bool:
        """The sandbox is killed (its volume kept or deleted as it asked)."""
        return self.name.startswith("END_")


def decide(record: SandboxRecord, now: float, *, busy: bool, paused_stop_after: float,
           paused_max_age: float = 0.0) -> Step | None:
    """What the reaper does to a sandbox now. Idle = no call in flight and none for its
    timeout; a call in flight keeps it awake whatever ``last_used`` says, but not past its
    lifetime."""
    if record.state not in VISIBLE:
        return None  # warm, being made or being killed: not a sandbox's life yet
    if record.lifetime is not None and record.created_at + record.lifetime <= now:
        return Step.END_LIFETIME
    if busy:
        return None
    idle_until = record.last_used + record.timeout
    if record.state == SandboxState.RUNNING and idle_until < now:
        return Step.END_IDLE if record.on_timeout == "kill" else Step.PAUSE
    if record.state == SandboxState.PAUSED:
        if paused_max_age and record.last_used + paused_max_age < now:
            return Step.END_AGE
        if idle_until + paused_stop_after < now:
            return Step.RELEASE
    return None


def next_change(record: SandboxRecord, *, busy: bool, paused_stop_after: float,
                paused_max_age: float = 0.0) -> float | None:
    """When ``decide`` may next answer otherwise for this record as it is (None: not by
    the clock alone): the reaper sleeps until the earliest of these, or until a change
    (a timeout set, a call ended) wakes it, so a timeout fires at its deadline."""
    if record.state not in VISIBLE:
        return None
    times: list[float] = []
    if record.lifetime is not None:
        times.append(record.created_at + record.lifetime)
    if not busy:  # a call in flight: its end wakes the reaper (Activity's on_idle)
        idle_until = record.last_used + record.timeout
        if record.state == SandboxState.RUNNING:
            times.append(idle_until)
        elif record.state == SandboxState.PAUSED:
            if paused_max_age:
                times.append(record.last_used + paused_max_age)
            times.append(idle_until + paused_stop_after)
    return min(times) if times else None


def poolable(spec: CreateSpec, limits: Limits, config: EngineConfig) -> bool:
    """A create a warm sandbox can serve: a pooled template, the default limits, no
    network, no kept volume."""
    return (config.pool_size > 0 and spec.template in config.pool_templates
            and spec.volume is None and spec.network.mode == "off"
            and limits == config.limits)
