"""The supervisor process of a data dir (``supervisor`` is its handle): every interval it
finishes what crashed processes left and keeps the idle timeouts, while no engine process
that reaps is alive, and exits once nothing can time out any more."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.runc.supervisor import (
    ALIVE,
    LINGER,
    MODULE,
    UNFINISHED,
    reaper_alive,
    try_lock,
)
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.states import SandboxState

if TYPE_CHECKING:
    from agent_sandbox.backends.runc.backend import RuncBackend
    from agent_sandbox.service.service import SandboxService


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} abx-supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _own_lock(data_dir: Path, handed: int | None) -> int | None:
    """The lock the starter handed down (still held: flock belongs to the open file), or
    one taken now when started by hand; ``None`` if another supervisor has it."""
    if handed is None:
        return try_lock(data_dir)
    os.set_inheritable(handed, False)  # runc and the guests must not keep it held
    fcntl.flock(handed, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: returns at once
    return handed


def _write_status(fd: int, since: float) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "since": since}).encode(), 0)


def needs_watching(backend: RuncBackend) -> bool:
    """Whether anything in the engine's data dir can still time out or needs finishing."""
    rows = backend.store.list_sandboxes()
    if any(row.state in UNFINISHED for row in rows):
        return True
    paused = {row.id for row in rows if row.state == SandboxState.PAUSED}
    if not paused:
        return False
    live = backend.runc.list_states()
    return any(live.get(sandbox_id) in ALIVE for sandbox_id in paused)


class _Watch:
    def __init__(self, service: SandboxService, backend: RuncBackend, lock_fd: int,
                 interval: float, stop: threading.Event) -> None:
        self.service = service
        self.backend = backend
        self.lock_fd = lock_fd
        self.since = time.time()
        self.interval = interval
        self.stop = stop
        self._last_problem = ""

    def run(self) -> None:
        db = self.backend.config.db_path
        idle_since: float | None = None
        due: float | None = None  # the next sandbox deadline (reap_once's): a pass then
        while not self.stop.wait(self.interval if due is None else
                                 min(self.interval, max(0.0, due - time.time()) + 0.01)):
            due = None
            if not db.exists():
                _log("the data dir was removed; exiting")
                return
            # An engine process that reaps (an MCP server, a gateway, a script) does this
            # work itself; the supervisor working beside one broke live sandboxes.
            if reaper_alive(self.backend.config.data_dir):
                idle_since = None
                continue
            self._step("recover", self.backend.recover)
            due = self._step("reap", self.service.reap_once)
            if self._busy():
                idle_since = None
                continue
            # Not at the first idle moment: a create right after the last kill (a script's
            # loop, a benchmark) would start a new process (~50 ms of CPU) every time.
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since < LINGER:
                continue
            # Nothing left: let go of the lock, then look once more. A create or resume
            # that found the lock held (and so started nobody) has its row in by now.
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            if not self._busy() or not _relock(self.lock_fd):
                return
            _write_status(self.lock_fd, self.since)  # in case another came and went

    def _busy(self) -> bool:
        try:
            return needs_watching(self.backend)
        except Exception as exc:  # noqa: BLE001 - a busy store: keep watching, retry
            self._problem(f"survey failed: {exc}")
            return True

    def _step(self, name: str, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - one failed step must not end the watch
            self._problem(f"{name} failed: {exc}")
            return None

    def _problem(self, message: str) -> None:
        if message != self._last_problem:  # the log does not grow with a repeated error
            _log(message)
            self._last_problem = message


def _relock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a new supervisor took over
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--paused-stop-after", type=float)
    parser.add_argument("--paused-max-age", type=float)
    parser.add_argument("--interval", type=float)
    parser.add_argument("--lock-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not (args.data_dir / "state.db").is_file():
        _log(f"no engine state in {args.data_dir}; nothing to supervise")
        return 1
    lock_fd = _own_lock(args.data_dir, args.lock_fd)
    if lock_fd is None:
        return 0
    _write_status(lock_fd, time.time())
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.set())
    # After the lock: most starts end above.
    from agent_sandbox.backends.runc.backend import RuncBackend
    from agent_sandbox.service.service import SandboxService

    # The engine's settings that reaping uses; no warm pool (that is a server's).
    config = EngineConfig(data_dir=args.data_dir, pool_size=0)
    if args.paused_stop_after is not None:
        config = replace(config, paused_stop_after=args.paused_stop_after)
    if args.paused_max_age is not None:
        config = replace(config, paused_max_age=args.paused_max_age)
    if args.interval is not None:
        config = replace(config, reaper_interval=args.interval)
    # Opening an engine recovers: not while an engine process that reaps is alive.
    while reaper_alive(args.data_dir) and (args.data_dir / "state.db").is_file():
        if stopping.wait(config.reaper_interval):
            return 0
    if stopping.is_set() or not (args.data_dir / "state.db").is_file():
        return 0  # stopped while starting, or its data dir was removed
    try:
        backend = RuncBackend(config)
        service = SandboxService(backend, config, reaper=False)
    except Exception as exc:  # noqa: BLE001 - logged; the next create starts another
        _log(f"cannot open the engine in {args.data_dir}: {exc}")
        return 1
    watch = _Watch(service, backend, lock_fd, config.reaper_interval, stopping)
    _log(f"supervising {args.data_dir}")
    try:
        watch.run()
    finally:
        service.close()
        _log("nothing left to supervise; exiting" if not watch.stop.is_set() else "stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
