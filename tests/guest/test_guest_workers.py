"""The guest's reused threads (agent_sandbox/guest/workers.py), in-process."""

from __future__ import annotations

import threading
import time

import pytest

from agent_sandbox.guest import workers


@pytest.fixture
def quick_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "IDLE_EXIT", 0.2)


def _wait(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_idle_worker_takes_the_next_job(quick_idle: None) -> None:
    names: list[str] = []
    first = workers.start(lambda: names.append(threading.current_thread().name))
    first.join(2)
    _wait(lambda: workers._idle >= 1)  # that worker now waits for a job
    second = workers.start(lambda: names.append(threading.current_thread().name))
    second.join(2)
    assert not first.is_alive() and not second.is_alive()
    assert names[0] == names[1]  # one thread ran both: no new thread for the second


def test_concurrent_jobs_each_get_a_thread_and_join_waits_for_them(quick_idle: None) -> None:
    gate = threading.Event()
    running = threading.Semaphore(0)

    def job() -> None:
        running.release()
        gate.wait(5)

    jobs = [workers.start(job) for _ in range(8)]
    for _ in range(8):  # all eight run at once: none queued behind a busy worker
        assert running.acquire(timeout=5)
    assert all(j.is_alive() for j in jobs)
    gate.set()
    for j in jobs:
        j.join(5)
    assert not any(j.is_alive() for j in jobs)


def test_idle_workers_are_capped_and_end_after_a_while(quick_idle: None) -> None:
    before = threading.active_count()
    gate = threading.Event()
    jobs = [workers.start(gate.wait, 5) for _ in range(workers.IDLE_MAX + 8)]
    gate.set()
    for j in jobs:
        j.join(5)
    _wait(lambda: workers._idle <= workers.IDLE_MAX)
    assert threading.active_count() <= before + workers.IDLE_MAX
    _wait(lambda: workers._idle == 0 and threading.active_count() <= before)


def test_a_failing_job_leaves_its_worker_usable(quick_idle: None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    def boom() -> None:
        raise ValueError("boom")

    workers.start(boom).join(2)
    _wait(lambda: workers._idle >= 1)
    done: list[int] = []
    workers.start(done.append, 1).join(2)
    assert done == [1]
    assert "ValueError('boom')" in capsys.readouterr().err


def test_a_job_promised_at_the_idle_timeout_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many short idle periods, each job handed over around a worker's timeout: none lost.
    monkeypatch.setattr(workers, "IDLE_EXIT", 0.001)
    done: list[int] = []
    for i in range(300):
        workers.start(done.append, i).join(2)
        time.sleep(0.001 if i % 2 else 0)
    assert done == list(range(300))
