"""The reaper's decisions (service/lifecycle.py): pure functions of a record and the time,
the same for every backend."""

from __future__ import annotations

import pytest

from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service.lifecycle import Step, decide, next_change
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


def test_next_change_is_the_deadline_decide_acts_at() -> None:
    """The reaper sleeps until the earliest ``next_change`` of its sandboxes: just past it
    ``decide`` acts, just before it does not (the timeout fires at its deadline)."""
    cases = [(_record(), Step.PAUSE), (_record(on_timeout="kill"), Step.END_IDLE),
             (_record(lifetime=10.0), Step.END_LIFETIME),
             (_record(SandboxState.PAUSED), Step.RELEASE)]
    for record, step in cases:
        due = next_change(record, busy=False, paused_stop_after=900)
        assert due is not None
        assert _decide(record, due - T0 - 0.5) is None
        assert _decide(record, due - T0 + 0.01) is step
    paused = _record(SandboxState.PAUSED)
    assert next_change(paused, busy=False, paused_stop_after=900,
                       paused_max_age=100) == T0 + 100
    # A call in flight: only its lifetime is due by the clock (its end wakes the reaper).
    assert next_change(_record(), busy=True, paused_stop_after=900) is None
    assert next_change(_record(lifetime=5.0), busy=True, paused_stop_after=900) == T0 + 5
    assert next_change(_record(SandboxState.CREATING), busy=False,
                       paused_stop_after=900) is None
