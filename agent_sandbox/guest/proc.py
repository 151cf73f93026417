"""One child process of the guest: its output tails, exit status and the clients
streaming it live (stdlib only)."""

from __future__ import annotations

import os
import select
import threading
import time
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

if __package__:
    from .limits import EXIT_DRAIN, SUB_BACKLOG, SUB_STALL
else:  # imported by agent.py from the guest's directory
    from limits import EXIT_DRAIN, SUB_BACKLOG, SUB_STALL  # type: ignore[no-redef]


class Subscriber:
    """Output chunks not yet delivered to one streaming client (guarded by proc.cond)."""

    __slots__ = ("chunks", "size", "cap", "dropped", "cancelled", "lagging")

    def __init__(self) -> None:
        self.chunks: Deque[Tuple[str, bytes]] = deque()
        self.size = 0
        self.cap = SUB_BACKLOG  # more while a replay of the tails is not taken yet
        self.dropped = False
        self.cancelled = False
        self.lagging = False  # waited for once already: not again until it catches up

    def push(self, name: str, data: bytes) -> None:
        self.chunks.append((name, data))
        self.size += len(data)
        while self.size > self.cap:  # a stuck client: keep the tail, like the buffers do
            self.size -= len(self.chunks.popleft()[1])
            self.dropped = True

    def take(self) -> List[Tuple[str, bytes]]:
        items = list(self.chunks)
        self.chunks.clear()
        self.size = 0
        self.cap = SUB_BACKLOG
        self.lagging = False
        return items

    def behind(self) -> bool:
        """Less than half a backlog of room left: the output should wait for it."""
        return self.size >= self.cap - SUB_BACKLOG // 2 and not (self.cancelled or self.lagging)


def wait_for_laggards(owner: Any, clients: List[Any], stall: float) -> None:
    """Wait on ``owner.cond`` while a client is ``behind()`` and ``owner`` has not exited,
    at most ``stall`` seconds; then mark the clients still behind as lagging. Waiting
    releases the cond: the reaper's on_exit is never held up (command and terminal)."""
    with owner.cond:
        deadline = time.monotonic() + stall
        while owner.exit_code is None and any(c.behind() for c in clients):
            left = deadline - time.monotonic()
            if left <= 0:
                for client in clients:
                    client.lagging = client.lagging or client.behind()
                return
            owner.cond.wait(left)


class Proc:
    """One child process: tail buffers, exit status, live subscribers."""

    def __init__(
        self,
        popen: Any,
        argv: List[str],
        max_output: int,
        background: bool,
        on_finished: Callable[["Proc"], None],
    ) -> None:
        self.popen = popen
        self.pid: int = popen.pid
        self.argv = argv
        self.max_output = max_output
        self.background = background
        self.started_at = time.time()
        self.cond = threading.Condition(threading.Lock())
        self.buffers: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False
        self.exit_code: Optional[int] = None
        self.drained = False  # output readable at exit time has been collected
        self.finished = False
        self.subs: List[Subscriber] = []
        self.stdin_lock = threading.Lock()
        self.stdin_fd: Optional[int] = popen.stdin.fileno() if popen.stdin else None
        self._on_finished = on_finished
        self._wake_r, self._wake_w = os.pipe()
        self._wake_open = True

    # -- output
    def subscribe(self, replay: bool) -> Subscriber:
        sub = Subscriber()
        with self.cond:
            if replay:  # the tails are bounded already (max_output): room for all of them
                sub.cap += sum(len(buf) for buf in self.buffers.values())
                for name, buf in self.buffers.items():
                    if buf:
                        sub.push(name, bytes(buf))
            self.subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self.cond:
            if sub in self.subs:
                self.subs.remove(sub)
            self.cond.notify_all()  # the pump may be waiting for this one

    def cancel(self, sub: Subscriber) -> None:
        with self.cond:
            sub.cancelled = True
            self.cond.notify_all()

    def _add(self, name: str, data: bytes) -> None:
        with self.cond:
            buf = self.buffers[name]
            buf += data
            if len(buf) > self.max_output:
                del buf[: len(buf) - self.max_output]
                self.truncated = True
            if not self.finished:
                for sub in self.subs:
                    sub.push(name, data)
                self.cond.notify_all()

    def taken(self) -> None:
        """A subscriber took its chunks (caller holds cond): wake a pump waiting for it."""
        self.cond.notify_all()

    def _throttle(self) -> None:
        """Let a client that is behind catch up before more is read, as a slow reader of
        a pipe makes its writer wait: memory stays bounded without dropping its output.
        At most SUB_STALL without progress: one stuck client never stops the process for
        good (its oldest output is dropped instead, until it takes again)."""
        wait_for_laggards(self, self.subs, SUB_STALL)

    def snapshot(self) -> Tuple[bytes, bytes]:
        with self.cond:
            return bytes(self.buffers["stdout"]), bytes(self.buffers["stderr"])

    def release_output(self) -> None:
        """Foreground output was delivered already; don't keep up to 2x max_output around."""
        with self.cond:
            self.buffers = {"stdout": bytearray(), "stderr": bytearray()}

    def pump(self) -> None:
        """Read stdout/stderr until EOF; runs in its own thread."""
        poller = select.poll()
        fds: Dict[int, str] = {}
        for name, pipe in (("stdout", self.popen.stdout), ("stderr", self.popen.stderr)):
            fds[pipe.fileno()] = name
            poller.register(pipe.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        drain_until: Optional[float] = None
        while fds:
            self._throttle()
            events = poller.poll(0 if drain_until is not None else None)
            if drain_until is not None and (not events or time.monotonic() > drain_until):
                # Exit seen and nothing left that was written before it: the command is
                # done. Keep reading (into the tail buffer) so that background grandchildren
                # holding the pipe don't get SIGPIPE.
                self._set_drained()
                drain_until = None
                continue
            for fd, _ in events:
                if fd == self._wake_r:
                    poller.unregister(fd)
                    self._close_wake()
                    drain_until = time.monotonic() + EXIT_DRAIN
                    continue
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if data:
                    self._add(fds[fd], data)
                else:
                    poller.unregister(fd)
                    del fds[fd]
        self.popen.stdout.close()
        self.popen.stderr.close()
        self._close_wake()
        self._set_drained()

    # -- lifecycle
    def on_exit(self, code: int) -> None:
        """Called by the reaper thread; never blocks on anything but self.cond."""
        with self.cond:
            if self.exit_code is not None:
                return
            self.exit_code = code
            self.popen.returncode = code  # we reap ourselves; Popen must never waitpid
            self.cond.notify_all()  # a pump waiting for a slow client reads the rest now
            if self._wake_open:
                os.write(self._wake_w, b"x")
                return
        self._set_drained()

    def _close_wake(self) -> None:
        with self.cond:  # under cond so on_exit never writes to a closed (reused) fd
            if self._wake_open:
                self._wake_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _set_drained(self) -> None:
        with self.cond:
            self.drained = True
            if self.exit_code is None or self.finished:
                return
            self.finished = True
            self.cond.notify_all()
        self._drop_stdin()
        self._on_finished(self)

    def signal(self, sig: int) -> bool:
        if self.finished:
            return False  # the group may be gone and its id reused
        try:
            os.killpg(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    # -- stdin
    def write_stdin(self, data: bytes) -> bool:
        """Write all of data (caller holds stdin_lock); False if the process closed it."""
        view = memoryview(data)
        while view and self.stdin_fd is not None:
            try:
                view = view[os.write(self.stdin_fd, view) :]
            except OSError:  # EPIPE: the reader is gone; drop the rest
                self.close_stdin_locked()
                return False
        return self.stdin_fd is not None

    def close_stdin_locked(self) -> None:
        if self.stdin_fd is not None:
            self.stdin_fd = None
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def _drop_stdin(self) -> None:
        # Never block here (we may be the reaper): a writer holding the lock closes it later.
        if self.stdin_lock.acquire(blocking=False):
            try:
                self.close_stdin_locked()
            finally:
                self.stdin_lock.release()

    def info(self) -> Dict[str, Any]:
        return {
            "pid": self.pid,
            "argv": self.argv,
            "running": not self.finished,
            "exit_code": self.exit_code if self.finished else None,
            "started_at": self.started_at,
            "background": self.background,
        }
