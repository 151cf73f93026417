"""The lifecycle supervisor: keeps the idle-timeout promise when no engine process runs.

An engine's own reaper thread lives only as long as its process (a CLI call lasts a
second). So the first container an engine boots, or the first sandbox it resumes, also
starts this: one detached process per data dir (its own session, stdio on /dev/null and
a 0600 log in the data dir, single by an flock on ``supervisor.lock``) that every
``reaper_interval`` seconds finishes what crashed engines left (``RuncBackend.recover``)
and pauses idle sandboxes, stopping long-paused ones (``SandboxService.reap_once``). It exits once
nothing can time out any more: no sandbox running, being made or being killed, and no
paused one whose container still holds memory.

Only per-sandbox lifecycle locks order it against engine processes, each held for one
step (a pause, a stop, a cleanup), never across a wait for a sandbox.

    python -m agent_sandbox.backends.runc.supervisor --data-dir DIR [--paused-stop-after S]
        [--paused-max-age S]

This package is the handle (start, stop, status, the reaper's lock); ``__main__`` is the
process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import agent_sandbox
from agent_sandbox.backends.runc.sandbox_lock import held_elsewhere
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.states import SandboxState

LOCK_NAME = "supervisor.lock"
LOG_NAME = "supervisor.log"
# Held shared by every engine process that runs its own reaper on the data dir.
REAPER_LOCK = "reaper.lock"
MODULE = "agent_sandbox.backends.runc.supervisor"
_LOG_MAX = 256 << 10  # a bigger log is started afresh at the next spawn
_STATUS_MAX = 4096
# runc statuses of a container that still holds memory (rootless "paused" is "running").
ALIVE = frozenset({"creating", "created", "running", "paused"})
UNFINISHED = frozenset({SandboxState.RUNNING, SandboxState.CREATING, SandboxState.KILLING,
                         SandboxState.KILLING_VOLUME})
_PACKAGE_ROOT = str(Path(agent_sandbox.__file__).resolve().parent.parent)


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
        lock = try_lock(config.data_dir)
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
    return MODULE.encode() in cmdline.split(b"\0")


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


def try_lock(data_dir: Path) -> int | None:
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
    argv = [sys.executable, "-m", MODULE, "--data-dir", str(config.data_dir.resolve()),
            "--paused-stop-after", repr(config.paused_stop_after),
            "--paused-max-age", repr(config.paused_max_age),
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
LINGER = 20.0  # seconds with nothing to watch before the supervisor exits
