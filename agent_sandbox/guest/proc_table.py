"""The guest's process table: starts children, reaps every process (the guest is
pid 1), and pauses the sandbox when the engine has no freezer (stdlib only)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

if __package__:
    from . import workers
    from .errors import GuestError, bad
    from .limits import FINISHED_KEPT
    from .proc import Proc, Subscriber
else:  # imported by agent.py from the guest's directory
    import workers  # type: ignore[no-redef]
    from errors import GuestError, bad  # type: ignore[no-redef]
    from limits import FINISHED_KEPT  # type: ignore[no-redef]
    from proc import Proc, Subscriber  # type: ignore[no-redef]


def exit_code(status: int) -> int:
    """Shell convention: killed by signal N -> 128 + N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


class ProcTable:
    """pid -> Proc, plus the reaper that waits for every child (we may be PID 1)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: Dict[int, Proc] = {}
        self.finished: Deque[Proc] = deque()
        self.spawned = threading.Event()
        # Live children that are not commands (terminals): their exits are theirs to keep.
        self.adopted: Dict[int, Any] = {}
        # Paused by the engine (rootless: no freezer): every process but us is stopped,
        # and nothing new may start until it thaws us.
        self.paused = False
        # Rootless without cgroups: the memory limit is an address-space rlimit on every
        # process we start (not on us: our threads' malloc arenas alone would exceed a
        # small one). Bound beforehand: the child of a threaded fork must not import.
        self.child_limit: Optional[Callable[[], None]] = None
        limit = os.environ.pop("ABX_GUEST_RLIMIT_AS", "")
        if limit.isdigit():
            import functools
            import resource

            self.child_limit = functools.partial(
                resource.setrlimit, resource.RLIMIT_AS, (int(limit), int(limit)))

    def spawn(
        self,
        argv: List[str],
        cwd: str,
        env: Dict[str, str],
        max_output: int,
        stdin: bool,
        background: bool,
        subscribe: bool,
        creds: Optional[Dict[str, Any]] = None,
    ) -> Tuple[Proc, Optional[Subscriber]]:
        """``creds``: Popen's user/group/extra_groups, to run it as another account."""
        import subprocess

        if not os.path.isdir(cwd):
            raise GuestError("not_found", f"working directory {cwd} does not exist")
        # Spawning under the table lock means the reaper cannot see the child's exit before
        # the child is registered, so no "early exits" bookkeeping (or pid-reuse
        # confusion with reaped orphans) is needed.
        with self.lock:
            if self.paused:
                raise GuestError("wrong_state", "the sandbox is paused: resume it first")
            try:
                popen = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    bufsize=0,
                    close_fds=True,
                    start_new_session=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    preexec_fn=self.child_limit,
                    **(creds or {}),
                )
            except FileNotFoundError:
                raise GuestError(
                    "not_found",
                    f"cannot execute {argv[0]!r}: no such program (PATH={env.get('PATH', '')})",
                ) from None
            except OSError as exc:
                if exc.filename == cwd:  # chdir failed: the account may not enter it
                    raise bad(f"cannot enter the working directory {cwd}: "
                              f"{exc.strerror or exc}") from None
                raise bad(f"cannot execute {argv[0]!r}: {exc.strerror or exc}") from None
            proc = Proc(popen, argv, max_output, background, self._on_finished)
            old = self.procs.pop(proc.pid, None)
            if old is not None and old in self.finished:
                self.finished.remove(old)  # pid reused
            self.procs[proc.pid] = proc
        self.spawned.set()
        sub = proc.subscribe(replay=False) if subscribe else None
        workers.start(proc.pump)
        return proc, sub

    def adopt(self, start: Callable[[], Any]) -> Any:
        """Start a child that is not a command (``start()`` returns it, with ``pid`` and
        ``on_exit(code)``) under the lock, so the reaper cannot miss its exit."""
        with self.lock:
            if self.paused:
                raise GuestError("wrong_state", "the sandbox is paused: resume it first")
            child = start()
            self.adopted[child.pid] = child
        self.spawned.set()
        return child

    def get(self, pid: int) -> Proc:
        with self.lock:
            proc = self.procs.get(pid)
        if proc is None:
            raise GuestError(
                "not_found",
                f"no process with pid {pid} (it was never started"
                " by this agent or has been evicted)",
            )
        return proc

    def list(self) -> List[Proc]:
        with self.lock:
            return list(self.procs.values())

    def _on_finished(self, proc: Proc) -> None:
        with self.lock:
            if self.procs.get(proc.pid) is not proc:
                return
            self.finished.append(proc)
            while len(self.finished) > FINISHED_KEPT:
                old = self.finished.popleft()
                if self.procs.get(old.pid) is old:
                    del self.procs[old.pid]

    def reap_forever(self) -> None:
        """Wait for any child, ours or orphans reparented to PID 1."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                self.spawned.wait()
                self.spawned.clear()
                continue
            with self.lock:
                proc = self.adopted.pop(pid, None) or self.procs.get(pid)
            if proc is not None:
                proc.on_exit(exit_code(status))

    def kill_all(self) -> None:
        with self.lock:
            adopted = list(self.adopted.values())
        for proc in self.list() + adopted:
            proc.signal(signal.SIGKILL)

    def set_paused(self, paused: bool) -> None:
        """Stop (or continue) every process in the sandbox except this one: as pid 1,
        kill(-1) reaches all of them and never ourselves."""
        with self.lock:  # no spawn in flight
            self.paused = paused
            try:
                os.kill(-1, signal.SIGSTOP if paused else signal.SIGCONT)
            except OSError:
                pass  # no other process
            if paused:
                _wait_stopped()


def _wait_stopped(limit: float = 2.0) -> None:
    """Return once every other process shows as stopped (a signal lands when its target
    next runs); stragglers forked meanwhile are stopped too."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        running = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or name == "1":
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"T", b"t", b"Z", b"X"):
                running.append(int(name))
        if not running:
            return
        for pid in running:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        time.sleep(0.001)
