"""The guest's ``watch`` operation: a directory's changes, streamed (stdlib only).

Request: ``{"op": "watch", "path": "/abs/dir", "recursive": bool, "backend": "auto" |
"inotify" | "poll", "timeout": seconds or null}``. Reply: ``{"started": true, "backend":
...}`` once the watches are in place (a change made after that is seen), then frames of
``{"events": [...]}`` (at most ``WATCH_BATCH`` each), until the client closes the
connection, the timeout passes or the directory goes: ``{"done": true, "ended": why}``.

Nothing is queued here beyond one read of the kernel's queue: a client that reads
slowly makes the kernel drop events, reported as an ``overflow`` event.
"""

from __future__ import annotations

import os
import select
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict, List, Optional

    Req = Dict[str, Any]

if __package__:
    from . import checks, ops, users, workers
    from . import protocol as proto
    from .conn import Conn
    from .errors import GuestError, bad, os_error
    from .limits import (
        MAX_POLL_WAIT,
        WATCH_ACTIVE_MAX,
        WATCH_BATCH,
        WATCH_DIRS_MAX,
        WATCH_POLL_ENTRIES,
        WATCH_POLL_INTERVAL,
        WATCH_SCAN_EVENTS,
    )
else:  # imported by agent.py from the guest's directory
    import checks  # type: ignore[no-redef]
    import ops  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    import users  # type: ignore[no-redef]
    import workers  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad, os_error  # type: ignore[no-redef]
    from limits import (  # type: ignore[no-redef]
        MAX_POLL_WAIT,
        WATCH_ACTIVE_MAX,
        WATCH_BATCH,
        WATCH_DIRS_MAX,
        WATCH_POLL_ENTRIES,
        WATCH_POLL_INTERVAL,
        WATCH_SCAN_EVENTS,
    )

_active = [0]
_active_lock = threading.Lock()


def _open(root: str, recursive: bool, backend: str) -> Any:
    # Imported on first use: ctypes would cost every guest start a few milliseconds.
    if __package__:
        from .watch_inotify import Inotify, Unavailable
        from .watch_poll import Poller
    else:
        from watch_inotify import Inotify, Unavailable  # type: ignore[no-redef]
        from watch_poll import Poller  # type: ignore[no-redef]
    if backend != "poll":
        try:
            return Inotify(root, recursive, WATCH_DIRS_MAX, WATCH_SCAN_EVENTS)
        except Unavailable:
            if backend == "inotify":
                raise GuestError("runtime_unavailable", "inotify is not available in this "
                                 "sandbox; watch with backend 'poll'") from None
        except OSError as exc:
            raise os_error(exc, root) from None
    try:
        return Poller(root, recursive, WATCH_POLL_ENTRIES, WATCH_POLL_INTERVAL)
    except OSError as exc:
        raise os_error(exc, root) from None


def op_watch(conn: Conn, req: Req) -> None:
    root = os.path.normpath(checks.path(req))
    if root.startswith("//"):
        root = "/" + root.lstrip("/")
    recursive = bool(req.get("recursive"))
    backend = req.get("backend") or "auto"
    if backend not in ("auto", "inotify", "poll"):
        raise bad(f"'backend' must be 'auto', 'inotify' or 'poll', got {backend!r}")
    timeout = checks.timeout(req)
    users.ensure_default_home(root)
    if not os.path.isdir(root):  # follows a symlink for the root only, as list does
        if not os.path.lexists(root):
            raise GuestError("not_found", f"{root}: no such file or directory")
        raise bad(f"{root}: not a directory")
    with _active_lock:
        if _active[0] >= WATCH_ACTIVE_MAX:
            raise GuestError("resource_exhausted", f"{WATCH_ACTIVE_MAX} directories are "
                             "watched already in this sandbox; stop one first")
        _active[0] += 1
    try:
        watcher = _open(root, recursive, backend)
        try:
            _serve(conn, watcher, timeout)
        finally:
            watcher.close()
    finally:
        with _active_lock:
            _active[0] -= 1


def _serve(conn: Conn, watcher: Any, timeout: Optional[float]) -> None:
    stop_r, stop_w = os.pipe()
    try:
        # Before the reader starts: a recv keeps the timeout it began with, and a watch
        # may be quiet for hours (the reader still sees the client close).
        conn.sock.settimeout(None)
        conn.reader = workers.start(_until_closed, conn, stop_w)
        conn.send({"started": True, "backend": watcher.name})
        ended = _pump(conn, watcher, stop_r, timeout)
        if ended is not None:
            conn.done(ended=ended)
    finally:
        os.close(stop_r)  # stop_w is the reader's: it closes it when done with it


def _pump(conn: Conn, watcher: Any, stop_r: int, timeout: Optional[float]
          ) -> Optional[str]:
    """Send events until the end; None when the client went away."""
    deadline = None if timeout is None else time.monotonic() + timeout
    poller = select.poll()  # not select(): a busy guest has descriptors above 1024
    poller.register(stop_r, select.POLLIN)
    fd = watcher.fileno()
    if fd is not None:
        poller.register(fd, select.POLLIN)
    _send(conn, watcher.notices)  # limits met while setting up
    watcher.notices = []
    while watcher.ended is None:
        wait = watcher.interval
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            wait = left if wait is None else min(wait, left)
        ready = poller.poll(None if wait is None else int(min(wait, MAX_POLL_WAIT) * 1000) + 1)
        if any(r == stop_r for r, _ in ready):
            return None
        if fd is None or ready:
            _send(conn, watcher.read())
    return watcher.ended


def _send(conn: Conn, events: List[Dict[str, Any]]) -> None:
    for start in range(0, len(events), WATCH_BATCH):
        conn.send({"events": events[start:start + WATCH_BATCH]})


def _until_closed(conn: Conn, stop_w: int) -> None:
    """Read (and ignore) client frames until it closes the connection, then wake the
    pump."""
    try:
        while proto.read_frame(conn.rfile) is not None:
            pass
    except (OSError, proto.ProtocolError):
        pass
    try:
        os.write(stop_w, b"x")
    except OSError:
        pass  # the pump ended first
    os.close(stop_w)


HANDLERS: Dict[str, Callable[[Conn, Req], None]] = {ops.WATCH: op_watch}
