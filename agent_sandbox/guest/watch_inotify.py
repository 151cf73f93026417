"""One watched directory (or tree) through the kernel's inotify, called with ctypes
(stdlib only).

Events come out as wire dicts: ``{"type": "create"|"modify"|"chmod"|"delete"|"rename"|
"overflow", "path": ..., "dir": bool}``, a rename with ``old_path``. A move inside the
watched tree is one rename; a move out of it is a delete, a move into it a create. A
recursive watch adds a watch for every directory as it appears (up to a bound) and
reports what a new directory already holds (files made before its watch existed).
"""

from __future__ import annotations

import ctypes  # imported by watch_ops on first use only
import errno
import os
import select
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Dict, List, Optional, Tuple

    Event = Dict[str, Any]

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
MASK = (IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK)
_HEAD = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
_READ = 64 << 10
_PAIR_WAIT_MS = 10  # a rename's second half is normally in the same read


class Unavailable(Exception):
    """No inotify here (no libc, no syscall, no instances left): poll instead."""


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
            getattr(libc, name)
    except (OSError, AttributeError) as exc:
        raise Unavailable(f"no inotify in this libc: {exc}") from None
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def overflow(message: str, dropped: Optional[int] = None) -> Event:
    return {"type": "overflow", "path": "", "dir": False, "dropped": dropped,
            "message": message}


class Inotify:
    name = "inotify"
    interval = None  # event-driven: wait on fileno()

    def __init__(self, root: str, recursive: bool, max_dirs: int, scan_events: int) -> None:
        self.libc = _libc()
        fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise Unavailable(f"inotify_init1: {os.strerror(ctypes.get_errno())}")
        self.fd = fd
        self.root = root
        self.recursive = recursive
        self.max_dirs = max_dirs
        self.scan_events = scan_events
        self.paths: Dict[int, str] = {}  # watch descriptor -> directory
        self.ended: Optional[str] = None
        self.notices: List[Event] = []
        self._limited = False
        try:
            self.root_wd = self._add(root, first=True)
            if recursive:
                self._add_tree(root, None)
        except BaseException:
            self.close()
            raise

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- watches
    def _add(self, path: str, first: bool = False) -> int:
        if len(self.paths) >= self.max_dirs:
            self._limit(f"more than {self.max_dirs} directories: the ones beyond are not "
                        "watched")
            return -1
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path),
                                         MASK if first else MASK | IN_DONT_FOLLOW)
        if wd < 0:
            err = ctypes.get_errno()
            if first:
                raise OSError(err, os.strerror(err), path)
            if err == errno.ENOSPC:
                self._limit("the kernel's inotify watch limit was reached: some "
                            "directories are not watched")
            return -1  # vanished meanwhile (ENOENT, ENOTDIR): its delete event follows
        self.paths[wd] = path
        return wd

    def _limit(self, message: str) -> None:
        if not self._limited:
            self._limited = True
            self.notices.append(overflow(message))

    def _add_tree(self, top: str, events: Optional[List[Event]]) -> None:
        """Watch every directory under ``top``; with ``events``, report what each holds
        (up to the scan budget)."""
        budget = self.scan_events
        stack = [top]
        while stack:
            directory = stack.pop()
            try:
                with os.scandir(directory) as it:
                    children = list(it)
            except OSError:
                continue
            for child in children:
                try:
                    is_dir = child.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if events is not None and budget > 0:
                    events.append({"type": "create", "path": child.path, "dir": is_dir})
                    budget -= 1
                if is_dir and self._add(child.path) >= 0:
                    stack.append(child.path)

    def _forget_tree(self, top: str) -> None:
        """Stop watching ``top`` and below (it left the watched tree)."""
        prefix = top + "/"
        for wd, path in list(self.paths.items()):
            if path == top or path.startswith(prefix):
                self.libc.inotify_rm_watch(self.fd, wd)
                del self.paths[wd]

    def _moved_tree(self, old: str, new: str) -> None:
        prefix = old + "/"
        for wd, path in self.paths.items():
            if path == old:
                self.paths[wd] = new
            elif path.startswith(prefix):
                self.paths[wd] = new + path[len(old):]

    # -- events
    def _raw(self) -> List[Tuple[int, int, int, str]]:
        out = []
        while True:
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                return out
            offset = 0
            while offset + _HEAD.size <= len(data):
                wd, mask, cookie, size = _HEAD.unpack_from(data, offset)
                raw = data[offset + _HEAD.size:offset + _HEAD.size + size]
                offset += _HEAD.size + size
                out.append((wd, mask, cookie, os.fsdecode(raw.split(b"\0", 1)[0])))
            if len(out) >= 4096:  # send what we have; the rest waits in the kernel
                return out

    def read(self) -> List[Event]:
        raw = self._raw()
        events: List[Event] = list(self.notices)
        self.notices = []
        moved: Dict[int, Tuple[str, bool]] = {}  # cookie -> (old path, is_dir)
        while True:
            for item in raw:
                self._one(item, events, moved)
            if not moved or self.fd < 0:
                break
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            if not poller.poll(_PAIR_WAIT_MS):
                break
            raw = self._raw()
        for old, is_dir in moved.values():  # moved out of the tree
            if is_dir and self.recursive:
                self._forget_tree(old)
            events.append({"type": "delete", "path": old, "dir": is_dir})
        events.extend(self.notices)
        self.notices = []
        return _coalesced(events)

    def _one(self, item: Tuple[int, int, int, str], events: List[Event],
             moved: Dict[int, Tuple[str, bool]]) -> None:
        wd, mask, cookie, name = item
        if mask & IN_Q_OVERFLOW:
            events.append(overflow("the kernel's event queue overflowed: events were lost"))
            return
        directory = self.paths.get(wd)
        if mask & IN_IGNORED:
            self.paths.pop(wd, None)
            if wd == self.root_wd and self.ended is None:
                self.ended = "the watched directory is gone"
            return
        if directory is None:
            return
        if wd == self.root_wd and mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT):
            self.ended = ("the watched directory was deleted" if mask & IN_DELETE_SELF else
                          "the watched directory was moved" if mask & IN_MOVE_SELF else
                          "the watched directory's filesystem was unmounted")
            return
        if not name:
            return  # about a subdirectory itself: its parent reports it
        path = os.path.join(directory, name)
        is_dir = bool(mask & IN_ISDIR)
        if mask & IN_MOVED_FROM:
            moved[cookie] = (path, is_dir)
        elif mask & IN_MOVED_TO:
            source = moved.pop(cookie, None)
            if source is not None:
                if is_dir and self.recursive:
                    self._moved_tree(source[0], path)
                events.append({"type": "rename", "path": path, "old_path": source[0],
                               "dir": is_dir})
            else:
                events.append({"type": "create", "path": path, "dir": is_dir})
                if is_dir and self.recursive and self._add(path) >= 0:
                    self._add_tree(path, None)
        elif mask & IN_CREATE:
            events.append({"type": "create", "path": path, "dir": is_dir})
            if is_dir and self.recursive and self._add(path) >= 0:
                self._add_tree(path, events)
        elif mask & IN_DELETE:
            events.append({"type": "delete", "path": path, "dir": is_dir})
        elif mask & IN_MODIFY:
            events.append({"type": "modify", "path": path, "dir": is_dir})
        elif mask & IN_ATTRIB:
            events.append({"type": "chmod", "path": path, "dir": is_dir})


def _coalesced(events: List[Event]) -> List[Event]:
    """Back-to-back modify (or chmod) events of one path are one event."""
    out: List[Event] = []
    for event in events:
        if out and event["type"] in ("modify", "chmod") and out[-1] == event:
            continue
        out.append(event)
    return out
