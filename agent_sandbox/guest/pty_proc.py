"""One terminal of the guest: a child on a pseudo-terminal of its own (new session, the
terminal as its controlling tty, so job control and Ctrl-C work), its recent output kept
in a bounded ring for clients that (re)attach, and the clients streaming it live
(stdlib only)."""

from __future__ import annotations

import os
import select
import struct
import threading
import time
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Deque, Dict, List, Optional

if __package__:
    from . import users
    from .errors import GuestError
    from .limits import EXIT_DRAIN, PTY_BACKLOG, PTY_RING, PTY_STALL, PTY_VIEWERS_CAP
    from .proc import wait_for_laggards
else:  # imported by agent.py from the guest's directory
    import users  # type: ignore[no-redef]
    from errors import GuestError  # type: ignore[no-redef]
    from limits import (  # type: ignore[no-redef]
        EXIT_DRAIN,
        PTY_BACKLOG,
        PTY_RING,
        PTY_STALL,
        PTY_VIEWERS_CAP,
    )
    from proc import wait_for_laggards  # type: ignore[no-redef]


class Viewer:
    """Output not yet delivered to one attached client (guarded by the terminal's cond)."""

    __slots__ = ("chunks", "size", "dropped", "cancelled", "lagging")

    def __init__(self) -> None:
        self.chunks: Deque[bytes] = deque()
        self.size = 0
        self.dropped = False
        self.cancelled = False
        self.lagging = False  # waited for once already: not again until it catches up

    def push(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        while self.size > PTY_BACKLOG:  # a client that stopped reading: keep the tail
            self.size -= len(self.chunks.popleft())
            self.dropped = True

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.size = 0
        self.lagging = False
        return data

    def behind(self) -> bool:
        return self.size >= PTY_BACKLOG // 2 and not (self.cancelled or self.lagging)


def _winsize(cols: int, rows: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


class PtyProc:
    """A child on a pseudo-terminal. Started by ``ProcTable.adopt`` (which reaps it and
    calls ``on_exit``); ``pump`` runs in a thread of its own."""

    def __init__(self, argv: List[str], cwd: str, env: Dict[str, str], cols: int, rows: int,
                 child_limit: Optional[Callable[[], None]],
                 on_finished: Callable[["PtyProc"], None], account: Any = None) -> None:
        import fcntl
        import subprocess
        import termios

        self._fcntl = fcntl
        self._termios = termios
        master, slave = os.openpty()  # both close-on-exec

        def child_setup() -> None:  # in the child, after setsid: no imports here
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            if child_limit is not None:
                child_limit()

        try:
            fcntl.ioctl(master, termios.TIOCSWINSZ, _winsize(cols, rows))
            creds = users.popen_kwargs(account)
            if account is not None:  # the user's terminal is theirs, as login(1) does
                os.fchown(slave, account.uid, account.gid)
            self.popen = subprocess.Popen(
                argv, cwd=cwd, env=env, bufsize=0, close_fds=True, start_new_session=True,
                stdin=slave, stdout=slave, stderr=slave, preexec_fn=child_setup, **creds)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self.master = master
        self.pid: int = self.popen.pid
        self.argv = argv
        self.size = (cols, rows)
        self.started_at = time.time()
        self.cond = threading.Condition(threading.Lock())
        self.ring = bytearray()
        self.viewers: List[Viewer] = []
        self.exit_code: Optional[int] = None
        self.finished = False
        self.input_lock = threading.Lock()  # one writer at a time: keystrokes stay whole
        self.fd_lock = threading.Lock()  # the terminal's fd is not closed while in use
        self._on_finished = on_finished
        self._wake_r, self._wake_w = os.pipe()

    # -- viewers
    def attach(self, replay: bool) -> Viewer:
        viewer = Viewer()
        with self.cond:
            if len(self.viewers) >= PTY_VIEWERS_CAP:
                raise GuestError("resource_exhausted", f"{len(self.viewers)} clients are "
                                 f"attached to terminal {self.pid} (at most {PTY_VIEWERS_CAP})")
            if replay and self.ring:
                viewer.push(bytes(self.ring))
            self.viewers.append(viewer)
        return viewer

    def detach(self, viewer: Viewer) -> None:
        with self.cond:
            if viewer in self.viewers:
                self.viewers.remove(viewer)
            self.cond.notify_all()

    def cancel(self, viewer: Viewer) -> None:
        with self.cond:
            viewer.cancelled = True
            self.cond.notify_all()

    def _add(self, data: bytes) -> None:
        with self.cond:
            self.ring += data
            if len(self.ring) > PTY_RING:
                del self.ring[: len(self.ring) - PTY_RING]
            for viewer in self.viewers:
                viewer.push(data)
            self.cond.notify_all()

    def _throttle(self) -> None:
        """Let a client that is behind catch up for a while before its oldest output is
        dropped: the program waits on its terminal meanwhile, as on a slow real one."""
        wait_for_laggards(self, self.viewers, PTY_STALL)

    def pump(self) -> None:
        """Read the terminal until every holder of its other end is gone, or until a
        short drain after the child's exit (background jobs may hold it forever)."""
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        drain_until: Optional[float] = None
        while True:
            self._throttle()
            wait_ms = None if drain_until is None else \
                max(0, int((drain_until - time.monotonic()) * 1000))
            events = poller.poll(wait_ms)
            if drain_until is not None and (not events or time.monotonic() > drain_until):
                break
            eof = False
            for fd, _ in events:
                if fd == self._wake_r:
                    poller.unregister(fd)
                    drain_until = time.monotonic() + EXIT_DRAIN
                    continue
                try:
                    data = os.read(self.master, 65536)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: nobody holds the terminal any more
                    data = b""
                if data:
                    self._add(data)
                else:
                    eof = True
            if eof:
                break
        with self.cond:
            while self.exit_code is None:  # the terminal hung up first: wait for the reaper
                self.cond.wait()
        self._finish()

    # -- lifecycle
    def on_exit(self, code: int) -> None:
        """Called by the reaper; never blocks on anything but self.cond."""
        with self.cond:
            if self.exit_code is not None:
                return
            self.exit_code = code
            self.popen.returncode = code  # we reap ourselves; Popen must never waitpid
            os.write(self._wake_w, b"x")  # closed only by _finish, after this
            self.cond.notify_all()

    def _finish(self) -> None:
        """In the pump's thread, once the output is read and the exit code known."""
        with self.fd_lock:
            os.close(self.master)  # hangs up the terminal for whatever still holds it
            with self.cond:
                self.finished = True
                self.cond.notify_all()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._on_finished(self)

    # -- control
    def write(self, data: bytes) -> None:
        """Type ``data`` (caller holds input_lock). A program that does not read its
        terminal makes this wait, as typing into a real one would."""
        view = memoryview(data)
        while view:
            with self.fd_lock:
                if self.finished:
                    return
                try:
                    view = view[os.write(self.master, view):]
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    return  # hung up: the program is gone
            time.sleep(0.01)

    def resize(self, cols: int, rows: int) -> None:
        """New size: the program in the foreground gets SIGWINCH from the kernel."""
        with self.fd_lock:
            if self.finished:
                return
            self.size = (cols, rows)
            try:
                self._fcntl.ioctl(self.master, self._termios.TIOCSWINSZ, _winsize(cols, rows))
            except OSError:
                pass

    def signal(self, sig: int) -> bool:
        """Signal the child's process group and the terminal's foreground job."""
        groups = [self.pid]
        with self.fd_lock:
            if self.finished:
                return False  # the groups may be gone and their ids reused
            try:
                groups.append(os.tcgetpgrp(self.master))
            except OSError:
                pass
            sent = False
            for group in dict.fromkeys(groups):
                try:
                    os.killpg(group, sig)
                    sent = True
                except (ProcessLookupError, PermissionError):
                    pass
        return sent

    def info(self) -> Dict[str, Any]:
        return {"pid": self.pid, "argv": self.argv, "cols": self.size[0],
                "rows": self.size[1], "running": not self.finished,
                "exit_code": self.exit_code if self.finished else None,
                "started_at": self.started_at}
