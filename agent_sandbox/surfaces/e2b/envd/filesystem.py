"""envd's Filesystem service on the gateway's provider: stat, list (with depth), make,
move and remove paths, and watch directories (``watchers``). Paths are absolute or
relative to the user's home (``paths``); the user is the one the request names (Basic
auth), E2B's default ``user`` otherwise.

Owner and group are the names in the sandbox's own /etc/passwd and /etc/group; metadata is
the file's ``user.e2b.*`` xattrs. A symlink is reported as envd >= 0.6 reports it: the type
of what it finally points at, ``symlink_target`` that entry's absolute path (a dangling or
looping one: its own path, type unspecified). A watch started with ``include_entry`` gives
the entry of what a create, write or chmod event names, as envd (best effort: none when it
is gone by then, or past ``ENTRIES_PER_BATCH`` in one batch)."""

from __future__ import annotations

import asyncio
import posixpath
import stat as stat_mod
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from agent_sandbox.core.errors import NotFoundError, SandboxError
from agent_sandbox.core.models import EntryInfo
from agent_sandbox.surfaces.e2b import target
from agent_sandbox.surfaces.e2b.envd import codecs, paths, watchers
from agent_sandbox.surfaces.e2b.envd.errors import blocking, connect_error
from agent_sandbox.surfaces.e2b.envd_pb.filesystem import filesystem_pb as pb
from agent_sandbox.surfaces.e2b.envd_pb.filesystem.filesystem_connect import (
    Filesystem,
    FilesystemASGIApplication,
)

_TYPES = {"file": pb.FileType.FILE, "dir": pb.FileType.DIRECTORY,
          "symlink": pb.FileType.SYMLINK}
_SETTLE = 0.15  # seconds an empty GetWatcherEvents waits for events on their way
ENTRIES_PER_BATCH = 256  # events of one batch given their entry at most (a stat apiece)
_CARRY_ENTRY = (pb.EventType.CREATE, pb.EventType.WRITE, pb.EventType.CHMOD)  # envd's
_KEEPALIVE = pb.WatchDirResponse(event=Oneof("keepalive", pb.WatchDirResponse.KeepAlive()))


def permissions(entry: EntryInfo) -> str:
    """The mode as Go's ``os.FileMode.String()`` spells it (what envd reports):
    ``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``, ``urwxr-xr-x`` for setuid..."""
    letters = {"dir": "d", "symlink": "L"}.get(entry.type, "")
    for bit, letter in ((stat_mod.S_ISUID, "u"), (stat_mod.S_ISGID, "g"),
                        (stat_mod.S_ISVTX, "t")):
        if entry.mode & bit:
            letters += letter
    rwx = "".join(ch if entry.mode & (1 << (8 - i)) else "-"
                  for i, ch in enumerate("rwxrwxrwx"))
    return (letters or "-") + rwx


def entry_info(entry: EntryInfo) -> pb.EntryInfo:
    seconds = int(entry.mtime // 1)
    kind, target = entry.type, entry.symlink_target
    if kind == "symlink":  # envd >= 0.6: what it resolves to, and that entry's type
        kind, target = entry.target_type or "other", entry.resolved_target or entry.path
    return pb.EntryInfo(
        name=entry.name, type=_TYPES.get(kind, pb.FileType.UNSPECIFIED),
        path=entry.path, size=entry.size, mode=entry.mode & 0o777,
        permissions=permissions(entry),
        modified_time=Timestamp(seconds=seconds, nanos=int((entry.mtime - seconds) * 1e9)),
        symlink_target=target, owner=entry.owner, group=entry.group,
        metadata=entry.metadata or {})


async def with_entries(found: target.Target, root: str,
                       events: list[pb.FilesystemEvent]) -> list[pb.FilesystemEvent]:
    """``events`` with the entry of what each create, write or chmod names (a stat now,
    as envd's: none when it is gone), at most ``ENTRIES_PER_BATCH`` of them."""
    out = []
    budget = ENTRIES_PER_BATCH
    for event in events:
        if event.type in _CARRY_ENTRY and budget > 0:
            budget -= 1
            path = posixpath.join(root, event.name)
            try:
                entry = await anyio.to_thread.run_sync(found.provider.stat,
                                                       found.sandbox_id, path)
            except SandboxError:
                entry = None
            if entry is not None:
                event = pb.FilesystemEvent(name=event.name, type=event.type,
                                           entry=entry_info(entry))
        out.append(event)
    return out


def _where(path: str, what: str = "path") -> tuple[target.Target, str]:
    """The request's sandbox and ``path`` resolved for its user."""
    found = target.current()
    try:
        return found, paths.resolve(path, found.user, what)
    except SandboxError as exc:
        raise connect_error(exc) from None


class FilesystemService(Filesystem):
    def __init__(self) -> None:
        self.watchers = watchers.Watchers()

    async def stat(self, request: pb.StatRequest, ctx: RequestContext[Any, Any],
                   /) -> pb.StatResponse:
        found, path = _where(request.path)
        entry = await blocking(lambda: found.provider.stat(found.sandbox_id, path), "Stat")
        return pb.StatResponse(entry=entry_info(entry))

    async def make_dir(self, request: pb.MakeDirRequest, ctx: RequestContext[Any, Any],
                       /) -> pb.MakeDirResponse:
        found, path = _where(request.path)

        def make() -> EntryInfo:
            sandbox = found.provider
            try:
                existing = sandbox.stat(found.sandbox_id, path)
            except NotFoundError:
                # With its parents, made for the user (E2B's: its commands may write there).
                sandbox.make_dir(found.sandbox_id, path, user=paths.username(found.user))
                return sandbox.stat(found.sandbox_id, path)
            if existing.type == "dir":
                raise ConnectError(Code.ALREADY_EXISTS, f"directory {path} already exists")
            raise ConnectError(Code.INVALID_ARGUMENT,
                               f"{path} already exists and is not a directory")

        return pb.MakeDirResponse(entry=entry_info(await blocking(make, "MakeDir")))

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any],
                   /) -> pb.MoveResponse:
        found, source = _where(request.source, "source")
        _, destination = _where(request.destination, "destination")

        def move() -> EntryInfo:
            found.provider.rename(found.sandbox_id, source, destination)
            return found.provider.stat(found.sandbox_id, destination)

        return pb.MoveResponse(entry=entry_info(await blocking(move, "Move")))

    async def list_dir(self, request: pb.ListDirRequest, ctx: RequestContext[Any, Any],
                       /) -> pb.ListDirResponse:
        found, path = _where(request.path)
        depth = request.depth or 1  # envd's default
        entries = await blocking(
            lambda: found.provider.list_files(found.sandbox_id, path, depth=depth), "ListDir")
        return pb.ListDirResponse(entries=[entry_info(e) for e in entries])

    async def remove(self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any],
                     /) -> pb.RemoveResponse:
        found, path = _where(request.path)

        def remove() -> None:
            try:
                found.provider.remove(found.sandbox_id, path)
            except NotFoundError:
                pass  # envd removes like `rm -rf`: nothing there is no error

        await blocking(remove, "Remove")
        return pb.RemoveResponse()

    async def _watch(self, path: str, recursive: bool) -> tuple[str, Any]:
        """A started watch of the request's sandbox (one of its key's watch slots)."""
        found, root = _where(path)
        try:
            release = found.state.watches.take(found.owner)
        except SandboxError as exc:
            raise connect_error(exc) from None
        try:
            stream = await blocking(lambda: found.provider.watch_dir(
                found.sandbox_id, root, recursive=recursive), "watch")
        except BaseException:
            release()
            raise
        return root, watchers.relay(stream, release)

    async def watch_dir(self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any],
                        /) -> AsyncIterator[pb.WatchDirResponse]:
        root, watch = await self._watch(request.path, request.recursive)
        found = target.current()
        try:
            yield pb.WatchDirResponse(event=Oneof("start", pb.WatchDirResponse.StartEvent()))
            # The keepalives (one per quiet 15 s) also find a client that went away.
            async for batch in watch.batches():
                if not batch:
                    yield _KEEPALIVE
                events = [out for event in batch for out in watchers.envd_events(root, event)]
                if request.include_entry:
                    events = await with_entries(found, root, events)
                for out in events:
                    yield pb.WatchDirResponse(event=Oneof("filesystem", out))
            if watch.error is not None:
                raise connect_error(watch.error)
        finally:
            watch.stream.close()

    async def create_watcher(self, request: pb.CreateWatcherRequest,
                             ctx: RequestContext[Any, Any], /) -> pb.CreateWatcherResponse:
        self.watchers.reap()
        root, watch = await self._watch(request.path, request.recursive)
        watcher_id = self.watchers.add(target.current().sandbox_id, root, watch,
                                       include_entry=request.include_entry)
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def get_watcher_events(self, request: pb.GetWatcherEventsRequest,
                                 ctx: RequestContext[Any, Any],
                                 /) -> pb.GetWatcherEventsResponse:
        self.watchers.reap()
        sandbox_id = target.current().sandbox_id
        events = self.watchers.events(sandbox_id, request.watcher_id)
        # Events come from the sandbox's watcher over the guest's channel (a few ms): an
        # empty poll waits for them briefly, so a poll right after a write sees it, as
        # with envd, whose watcher is beside the write.
        settle = time.monotonic() + _SETTLE
        while not events and time.monotonic() < settle:
            await asyncio.sleep(0.01)
            events = self.watchers.events(sandbox_id, request.watcher_id)
        root = self.watchers.entries_root(sandbox_id, request.watcher_id)
        if events and root is not None:
            events = await with_entries(target.current(), root, events)
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(self, request: pb.RemoveWatcherRequest,
                             ctx: RequestContext[Any, Any], /) -> pb.RemoveWatcherResponse:
        self.watchers.reap()
        self.watchers.remove(target.current().sandbox_id, request.watcher_id)
        return pb.RemoveWatcherResponse()


def application() -> FilesystemASGIApplication:
    return FilesystemASGIApplication(FilesystemService(), codecs=codecs.codecs())
