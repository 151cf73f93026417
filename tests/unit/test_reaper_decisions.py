"""The reaper's decisions (service/lifecycle.py): pure functions of a record and the time,
the same for every backend."""

from __future__ import annotations

import pytest

from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service.lifecycle import Step, decide
from agent_sandbox.service.record import SandboxRecord

T0 = 1_000_000.0


def _record(state: SandboxState = SandboxState.RUNNING, **fields: object) -> SandboxRecord:
    base = {"id": "sbx-aaaaaaaaaa", "template": "base", "state": state, "created_at": T0,
            "last_used": T0, "timeout": 60.0, "persistent": False,
            "network": NetworkPolicy(), "volume_id": "vol-aaaaaaaaaa"}
    return SandboxRecord(**{**base, **fields})  # type: ignore[arg-type]


def _decide(record: SandboxRecord, after: float, *, busy: bool = False,
            max_age: float = 0.0) -> Step | None:
    return decide(record, T0 + after, busy=busy, paused_stop_after=900,
                  paused_max_age=max_age)


def test_idle_pauses_by_default_and_kills_when_asked() -> None:
    assert _decide(_record(), 30) is None
    assert _decide(_record(), 61) is Step.PAUSE
    assert _decide(_record(on_timeout="kill"), 61) is Step.END_IDLE
    assert _decide(_record(on_timeout="kill"), 61, busy=True) is None  # a call in flight


def test_a_lifetime_ends_it_busy_or_not_paused_or_not() -> None:
    for state in (SandboxState.RUNNING, SandboxState.PAUSED):
        record = _record(state, lifetime=10.0, timeout=3600.0)
        assert _decide(record, 9, busy=True) is None
        assert _decide(record, 10, busy=True) is Step.END_LIFETIME
    assert Step.END_LIFETIME.ends and not Step.PAUSE.ends


def test_the_operators_maximum_age_ends_a_paused_one_unused_that_long() -> None:
    paused = _record(SandboxState.PAUSED)
    assert _decide(paused, 1000) is Step.RELEASE  # paused long: memory back, disk kept
    assert _decide(paused, 1000, max_age=5000) is Step.RELEASE
    assert _decide(paused, 5001, max_age=5000) is Step.END_AGE
    assert _decide(_record(), 5001, max_age=5000) is Step.PAUSE  # running: idle first


@pytest.mark.parametrize("state", [SandboxState.POOLED, SandboxState.CREATING,
                                   SandboxState.KILLING])
def test_work_in_progress_and_warm_ones_are_left_alone(state: SandboxState) -> None:
    assert _decide(_record(state, lifetime=1.0, on_timeout="kill"), 10_000) is None
