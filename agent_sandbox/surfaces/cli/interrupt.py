"""Running one SDK call so that Ctrl-C, SIGTERM or SIGHUP on ``abx`` stop what it started
inside the sandbox (``agent_sandbox.core.cancel``): the call runs in a worker thread under a
``CallCancel``; the signal cancels it (a foreground command is killed in the guest, the
gateway's stream is cut so the gateway stops it), then ``abx`` exits 128+signal."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agent_sandbox.core.cancel import CallCancel

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE = 10.0  # seconds the call may take to stop once cancelled, before abx leaves anyway


class Interrupted(Exception):
    """A signal stopped the call; ``exit_code`` is 128 + its number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum


def run_interruptible(fn: Callable[[], T]) -> T:
    """``fn()``; a signal cancels it and raises ``Interrupted`` (a second one, or the
    grace running out, stops waiting for it)."""
    if threading.current_thread() is not threading.main_thread():
        return fn()  # signal handlers belong to the main thread
    call = CallCancel()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call.run(fn)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = exc

    got: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        got.append(signum)
        call.cancel()

    previous = {}
    for sig in SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, on_signal)
    worker = threading.Thread(target=work, name="abx-call", daemon=True)
    try:
        worker.start()
        deadline = None
        while worker.is_alive():
            worker.join(0.1)
            if got and deadline is None:
                deadline = time.monotonic() + GRACE
            if deadline is not None and (len(got) > 1 or time.monotonic() > deadline):
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if got:
        raise Interrupted(got[0])
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def quiet_broken_pipe() -> None:
    """stdout's reader went away (``abx ... | head``): no 'Exception ignored' at exit."""
    with contextlib.suppress(OSError, ValueError):
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
