"""Reused threads for the guest's jobs (stdlib only).

A command costs the guest up to three threads (its connection, its output pump, the watch
for its client going away), and starting one costs ~90 us of CPU plus a GIL round trip
(``Thread.start`` waits for the new thread to run): about a fifth of what the guest spends
on ``true``. ``start(fn, *args)`` hands the job to an idle worker, or starts one when none
is idle. Idle workers are few (``IDLE_MAX``) and short-lived (``IDLE_EXIT``): each holds a
pid of the sandbox's pids limit, which belongs to the sandbox's own programs.
"""

from __future__ import annotations

import queue
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Optional, Tuple

    Job = Tuple[Callable[..., Any], Tuple[Any, ...], "Done"]

IDLE_MAX = 16  # idle workers kept; more end at once
IDLE_EXIT = 5.0  # seconds an idle worker waits for a job before it ends

_lock = threading.Lock()
_idle = 0  # workers waiting in _jobs.get that no job has been promised to yet
_jobs: queue.SimpleQueue = queue.SimpleQueue()


class Done:
    """Set once a job has returned: what ``Thread.join`` was to a thread of its own."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def join(self, timeout: Optional[float] = None) -> None:
        self._event.wait(timeout)

    def is_alive(self) -> bool:
        return not self._event.is_set()


def start(fn: Callable[..., Any], *args: Any) -> Done:
    """Run ``fn(*args)`` on a worker thread; never blocks on the job."""
    global _idle
    done = Done()
    with _lock:
        if _idle > 0:
            _idle -= 1  # promised: that worker takes this job, not its timeout
            _jobs.put((fn, args, done))
            return done
    threading.Thread(target=_work, args=((fn, args, done),), daemon=True).start()
    return done


def _work(job: Optional[Job]) -> None:
    while job is not None:
        fn, args, done = job
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - a job's failure must not end the worker
            sys.stderr.write(f"abx-guest: a worker's job failed: {exc!r}\n")
        finally:
            done._event.set()
        del job, fn, args, done  # nothing of a finished job is kept while waiting
        job = _next()


def _next() -> Optional[Job]:
    """The next job, or None when this worker should end."""
    global _idle
    with _lock:
        if _idle >= IDLE_MAX:
            return None
        _idle += 1
    try:
        return _jobs.get(timeout=IDLE_EXIT)
    except queue.Empty:
        pass
    with _lock:
        # Every waiting worker is either still idle or has a job promised to it: if the
        # idle count is spent, a job was promised to us after the timeout, so take it.
        if _idle > 0:
            _idle -= 1
            return None
    return _jobs.get()
