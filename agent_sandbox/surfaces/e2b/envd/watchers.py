"""envd's directory watches on the gateway's (``watch_relay.Relay``: a thread reading the
sandbox's watch into a bounded queue; each holds one of the key's ``state.watches`` slots).

Two shapes, as E2B's SDKs use them: ``WatchDir``, a stream (the async Python SDK, the JS
SDK), and the polling trio ``CreateWatcher`` / ``GetWatcherEvents`` / ``RemoveWatcher`` (the
sync Python SDK's ``files.watch_dir``), whose watchers live here between polls: found only
by the sandbox they watch, closed when removed, and when not polled for ``IDLE`` seconds
(or ``ENDED_KEEP`` once their watch has ended), so a client that forgets one leaks nothing
for long.

Events become envd's: create, write, remove, rename, chmod, named relative to the watched
directory. ``files.write`` writes a file through a temporary one beside it
(``.NAME.abx-<12 hex>``, ``.abx_`` when NAME is new): its events are left out, and its final
rename onto NAME is reported as envd reports a write: CREATE, CHMOD, WRITE of a new file,
WRITE of one replaced. A rename is RENAME of the old name then
CREATE of the new one (as envd's inotify watcher reports it); ``overflow`` (events lost
because nobody read them) has no envd equivalent and is left out.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from connectrpc.code import Code
from connectrpc.errors import ConnectError

from agent_sandbox.core.models import FilesystemEvent
from agent_sandbox.core.watch import WatchStream
from agent_sandbox.surfaces.e2b.envd.errors import connect_error
from agent_sandbox.surfaces.e2b.envd_pb.filesystem import filesystem_pb as pb
from agent_sandbox.surfaces.http.watch_relay import Relay

IDLE = 3600.0  # seconds a polling watcher lives without GetWatcherEvents
ENDED_KEEP = 60.0  # ...once its watch has ended (the sandbox is gone, the directory removed)
MAX_POLL = 1024  # events one GetWatcherEvents answers with at most (the rest: next poll)
_TEMP = re.compile(r"^\.(.+)\.abx([-_])[0-9a-f]{12}$")  # guest/file_ops.py's atomic write
_TYPES = {"create": pb.EventType.CREATE, "modify": pb.EventType.WRITE,
          "delete": pb.EventType.REMOVE, "chmod": pb.EventType.CHMOD}


def _relative(root: str, path: str) -> str | None:
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


def _is_temp(name: str) -> bool:
    return _TEMP.match(name.rsplit("/", 1)[-1]) is not None


def _new_file(temp: str) -> bool:
    """The write made the file (``.abx_``) rather than replaced one (``.abx-``)."""
    found = _TEMP.match(temp.rsplit("/", 1)[-1])
    return found is not None and found.group(2) == "_"


def envd_events(root: str, event: FilesystemEvent) -> list[pb.FilesystemEvent]:
    """One of our events as envd's (none, one or two)."""
    name = event.name or _relative(root, event.path) or event.path
    if event.type == "rename":
        old = _relative(root, event.old_path or "")
        if old is not None and _is_temp(old):
            if _is_temp(name):
                return []
            # As envd's own write is seen: a new file is made, given its owner and
            # written; an existing one is written (truncated, then its data).
            kinds = ((pb.EventType.CREATE, pb.EventType.CHMOD, pb.EventType.WRITE)
                     if _new_file(old) else (pb.EventType.WRITE,))
            return [pb.FilesystemEvent(name=name, type=kind) for kind in kinds]
        out = [] if old is None else [pb.FilesystemEvent(name=old, type=pb.EventType.RENAME)]
        return out + [pb.FilesystemEvent(name=name, type=pb.EventType.CREATE)]
    kind = _TYPES.get(event.type)
    if kind is None or _is_temp(name):
        return []
    return [pb.FilesystemEvent(name=name, type=kind)]


def relay(stream: WatchStream, release: Callable[[], None]) -> Relay:
    return Relay(stream, asyncio.get_running_loop(), release)


@dataclass
class _Watcher:
    sandbox_id: str
    root: str
    relay: Relay
    include_entry: bool = False  # events carry the entry they name (envd >= 0.6.3)
    polled: float = field(default_factory=time.monotonic)

    def expired(self, now: float) -> bool:
        keep = ENDED_KEEP if self.relay.queue.finished else IDLE
        return now - self.polled > keep


class Watchers:
    """The polling watchers of one gateway."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: dict[str, _Watcher] = {}

    def reap(self) -> None:
        """Close the watchers nobody polls any more (each gives its slot back)."""
        now = time.monotonic()
        with self._lock:
            gone = [k for k, w in self._all.items() if w.expired(now)]
            dropped = [self._all.pop(k) for k in gone]
        for watcher in dropped:
            watcher.relay.stream.close()

    def add(self, sandbox_id: str, root: str, watch: Relay, *,
            include_entry: bool = False) -> str:
        watcher_id = secrets.token_hex(12)
        with self._lock:
            self._all[watcher_id] = _Watcher(sandbox_id, root, watch, include_entry)
        return watcher_id

    def entries_root(self, sandbox_id: str, watcher_id: str) -> str | None:
        """The watched directory when the watcher's events carry entries, else None."""
        with self._lock:
            watcher = self._all.get(watcher_id)
        if watcher is None or watcher.sandbox_id != sandbox_id or not watcher.include_entry:
            return None
        return watcher.root

    def _get(self, sandbox_id: str, watcher_id: str) -> _Watcher:
        with self._lock:
            watcher = self._all.get(watcher_id)
        if watcher is None or watcher.sandbox_id != sandbox_id:
            raise ConnectError(Code.NOT_FOUND, f"no watcher {watcher_id[:40]!r} in this "
                               "sandbox: it was stopped, or expired after "
                               f"{int(IDLE)} s without polling (create a new one)")
        return watcher

    def events(self, sandbox_id: str, watcher_id: str) -> list[pb.FilesystemEvent]:
        """What happened since the last poll; the error that ended the watch once all
        its events were taken (the watcher is then removed)."""
        watcher = self._get(sandbox_id, watcher_id)
        watcher.polled = time.monotonic()
        out: list[pb.FilesystemEvent] = []
        for event in watcher.relay.queue.drain(MAX_POLL):
            out.extend(envd_events(watcher.root, event))
        error = watcher.relay.error
        if not out and error is not None and watcher.relay.queue.finished:
            self.remove(sandbox_id, watcher_id)
            raise connect_error(error)
        return out

    def remove(self, sandbox_id: str, watcher_id: str) -> None:
        self._get(sandbox_id, watcher_id)
        with self._lock:
            watcher = self._all.pop(watcher_id, None)
        if watcher is not None:
            watcher.relay.stream.close()
