"""The lifecycle supervisor: keeps the idle-timeout promise when no engine process runs.

An engine's own reaper thread lives only as long as its process (a CLI call lasts a
second). So the first container an engine boots, or the first sandbox it resumes, also
starts this: one detached process per data dir (its own session, stdio on /dev/null and
a 0600 log in the data dir, single by an flock on ``supervisor.lock``) that every
``reaper_interval`` seconds finishes what crashed engines left (``Engine.recover``) and
pauses idle sandboxes, stopping long-paused ones (``Engine.reap_once``). It exits once
nothing can time out any more: no sandbox running, being made or being killed, and no
paused one whose container still holds memory.

Only per-sandbox lifecycle locks order it against engine processes, each held for one
step (a pause, a stop, a cleanup), never across a wait for a sandbox.

    python -m agent_sandbox.runtime.supervisor --data-dir DIR [--paused-stop-after S]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent_sandbox.runtime.config import EngineConfig
from agent_sandbox.runtime.sandbox_lock import held_elsewhere
from agent_sandbox.runtime.store import SandboxState

if TYPE_CHECKING:
    from agent_sandbox.runtime.engine import Engine

LOCK_NAME = "supervisor.lock"
LOG_NAME = "supervisor.log"
# Held shared by every engine process that runs its own reaper on the data dir.
REAPER_LOCK = "reaper.lock"
_MODULE = "agent_sandbox.runtime.supervisor"
_LOG_MAX = 256 << 10  # a bigger log is started afresh at the next spawn
_STATUS_MAX = 4096
# runc statuses of a container that still holds memory (rootless "paused" is "running").
_ALIVE = frozenset({"creating", "created", "running", "paused"})
_UNFINISHED = frozenset({SandboxState.RUNNING, SandboxState.CREATING, SandboxState.KILLING,
                         SandboxState.KILLING_VOLUME})
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)


@dataclass(frozen=True)
class Status:
    running: bool
    pid: int = 0
    since: float = 0.0


def status(data_dir: Path) -> Status:
    """Whether the data dir's supervisor runs, and its pid and start time if so."""
    lock = data_dir / LOCK_NAME
    if not held_elsewhere(lock):
        return Status(False)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return Status(True)
    try:
        raw = json.loads(os.read(fd, _STATUS_MAX) or b"{}")
    except (OSError, ValueError):
        raw = None
    finally:
        os.close(fd)
    if not isinstance(raw, dict):
        return Status(True)
    pid, since = raw.get("pid"), raw.get("since")
    return Status(True, pid if isinstance(pid, int) and pid > 0 else 0,
                  float(since) if isinstance(since, int | float) else 0.0)


def ensure_running(config: EngineConfig) -> None:
    """Start the supervisor of ``config.data_dir`` unless one runs. Cheap (an flock probe)
    when it does; never fails the caller (the next create or resume tries again).

    The lock is taken here and handed down to the new process: from this moment it counts
    as running, so no second one starts and ``stop`` waits for it while it starts up."""
    try:
        lock = _try_lock(config.data_dir)
    except OSError:
        return
    if lock is None:
        return
    try:
        _spawn(config, lock)
    except (OSError, subprocess.SubprocessError):
        pass
    finally:
        os.close(lock)  # the child's copy keeps it


def stop(data_dir: Path, timeout: float = 30.0) -> bool:
    """Ask the data dir's supervisor to exit (SIGTERM); whether none runs afterwards."""
    signalled: set[int] = set()
    deadline = time.monotonic() + timeout
    while (found := status(data_dir)).running:
        # One still starting up has not written its pid yet: signal it once it has.
        if found.pid and found.pid not in signalled and _is_supervisor(found.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(found.pid, signal.SIGTERM)
            signalled.add(found.pid)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _is_supervisor(pid: int) -> bool:
    """The pid in the status file is still ours (not a reused pid of something else)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()[:_STATUS_MAX]
    except OSError:
        return False
    return _MODULE.encode() in cmdline.split(b"\0")


def hold_reaper_lock(data_dir: Path) -> int | None:
    """Say, for as long as the returned descriptor is open, that this process reaps the
    data dir itself (a shared flock: any number of engines at once)."""
    try:
        fd = os.open(data_dir / REAPER_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def reaper_alive(data_dir: Path) -> bool:
    """Whether some engine process reaps the data dir now."""
    return held_elsewhere(data_dir / REAPER_LOCK)


def _try_lock(data_dir: Path) -> int | None:
    fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None  # another one runs
    os.ftruncate(fd, 0)  # no stale pid while the new one starts
    return fd


def _spawn(config: EngineConfig, lock: int) -> None:
    """Start it detached: ``sh`` backgrounds it in a new session and exits at once, so it
    is nobody's child (no zombie in a long-lived caller) and outlives the caller."""
    argv = [sys.executable, "-m", _MODULE, "--data-dir", str(config.data_dir.resolve()),
            "--paused-stop-after", repr(config.paused_stop_after),
            "--interval", repr(config.reaper_interval), "--lock-fd", str(lock)]
    env = dict(os.environ)
    # This copy of the package, whatever the caller's sys.path was built from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH"))
                                        if p)
    log = open_log(config.data_dir / LOG_NAME)
    try:
        subprocess.run(["/bin/sh", "-c", '"$@" &', "abx-supervisor", *argv],
                       stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd="/",
                       start_new_session=True, pass_fds=(lock,), check=False, timeout=30)
    finally:
        os.close(log)


def open_log(path: Path, max_bytes: int = _LOG_MAX) -> int:
    """A host-side helper's log for appending, 0600, started afresh once over ``max_bytes``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        if path.stat().st_size > max_bytes:
            flags |= os.O_TRUNC
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


# the supervisor process ---------------------------------------------------------------
def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} abx-supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _own_lock(data_dir: Path, handed: int | None) -> int | None:
    """The lock the starter handed down (still held: flock belongs to the open file), or
    one taken now when started by hand; ``None`` if another supervisor has it."""
    if handed is None:
        return _try_lock(data_dir)
    os.set_inheritable(handed, False)  # runc and the guests must not keep it held
    fcntl.flock(handed, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: returns at once
    return handed


def _write_status(fd: int, since: float) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "since": since}).encode(), 0)


def needs_watching(engine: Engine) -> bool:
    """Whether anything in the engine's data dir can still time out or needs finishing."""
    rows = engine.store.list_sandboxes()
    if any(row.state in _UNFINISHED for row in rows):
        return True
    paused = {row.id for row in rows if row.state == SandboxState.PAUSED}
    if not paused:
        return False
    live = engine.runc.list_states()
    return any(live.get(sandbox_id) in _ALIVE for sandbox_id in paused)


LINGER = 20.0  # seconds with nothing to watch before the supervisor exits


class _Watch:
    def __init__(self, engine: Engine, lock_fd: int, interval: float,
                 stop: threading.Event) -> None:
        self.engine = engine
        self.lock_fd = lock_fd
        self.since = time.time()
        self.interval = interval
        self.stop = stop
        self._last_problem = ""

    def run(self) -> None:
        db = self.engine.config.db_path
        idle_since: float | None = None
        while not self.stop.wait(self.interval):
            if not db.exists():
                _log("the data dir was removed; exiting")
                return
            # An engine process that reaps (an MCP server, a gateway, a script) does this
            # work itself; the supervisor working beside one broke live sandboxes.
            if reaper_alive(self.engine.config.data_dir):
                idle_since = None
                continue
            self._step("recover", self.engine.recover)
            self._step("reap", self.engine.reap_once)
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
            return needs_watching(self.engine)
        except Exception as exc:  # noqa: BLE001 - a busy store: keep watching, retry
            self._problem(f"survey failed: {exc}")
            return True

    def _step(self, name: str, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - one failed step must not end the watch
            self._problem(f"{name} failed: {exc}")

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
    parser = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--paused-stop-after", type=float)
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
    from agent_sandbox.runtime.engine import Engine  # after the lock: most starts end above

    # The engine's settings that reaping uses; no warm pool (that is a server's).
    config = EngineConfig(data_dir=args.data_dir, pool_size=0)
    if args.paused_stop_after is not None:
        config = replace(config, paused_stop_after=args.paused_stop_after)
    if args.interval is not None:
        config = replace(config, reaper_interval=args.interval)
    # Opening an engine recovers: not while an engine process that reaps is alive.
    while reaper_alive(args.data_dir) and (args.data_dir / "state.db").is_file():
        if stopping.wait(config.reaper_interval):
            return 0
    if stopping.is_set() or not (args.data_dir / "state.db").is_file():
        return 0  # stopped while starting, or its data dir was removed
    try:
        engine = Engine(config, reaper=False)
    except Exception as exc:  # noqa: BLE001 - logged; the next create starts another
        _log(f"cannot open the engine in {args.data_dir}: {exc}")
        return 1
    watch = _Watch(engine, lock_fd, config.reaper_interval, stopping)
    _log(f"supervising {args.data_dir}")
    try:
        watch.run()
    finally:
        engine.close()
        _log("nothing left to supervise; exiting" if not watch.stop.is_set() else "stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
