"""``AsyncSandbox``: ``Sandbox`` for asyncio code, generated from it (see ``twin``).

Every method is the sync one run in a worker thread, so concurrent calls run
concurrently and the event loop never stalls; output callbacks may be plain functions or
coroutine functions. ``await sb.state`` asks the provider, as ``Sandbox.state`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agent_sandbox.core.models import FilesystemEvent, SandboxInfo
from agent_sandbox.core.provider import Provider
from agent_sandbox.sdk.commands import CommandHandle, Commands
from agent_sandbox.sdk.files import Files
from agent_sandbox.sdk.pty import Pty, PtyHandle
from agent_sandbox.sdk.sandbox import Sandbox
from agent_sandbox.sdk.secret import Secret
from agent_sandbox.sdk.twin import AsyncTwin, async_twin_of
from agent_sandbox.sdk.volume import Volume
from agent_sandbox.sdk.watch import WatchHandle

__all__ = ["AsyncCommandHandle", "AsyncCommands", "AsyncFiles", "AsyncPty", "AsyncPtyHandle",
           "AsyncSandbox", "AsyncSecret", "AsyncVolume", "AsyncWatchHandle"]
_POLL = 0.5  # seconds an async iteration's thread waits before looking again


@async_twin_of(WatchHandle)
class AsyncWatchHandle(AsyncTwin):
    """A watched directory (``async for event in handle``, ``await handle.stop()``)."""

    def __aiter__(self) -> AsyncIterator[FilesystemEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[FilesystemEvent]:
        # Short waits in the thread: a cancelled iteration leaves no thread waiting long.
        while True:
            event = await asyncio.to_thread(self._sync.next_event, _POLL)
            if event is not None:
                yield event
            elif self._sync._done():
                return


@async_twin_of(Volume)
class AsyncVolume(AsyncTwin):
    """Kept /workspace volumes for asyncio: ``await AsyncVolume.list()``."""


@async_twin_of(Secret)
class AsyncSecret(AsyncTwin):
    """Secrets for asyncio: ``await AsyncSecret.create(...)``, ``await AsyncSecret.list()``."""


@async_twin_of(CommandHandle)
class AsyncCommandHandle(AsyncTwin):
    """A background command (``await handle.wait()``, ``output()``, ``kill()``...)."""

    pid: int


@async_twin_of(Commands)
class AsyncCommands(AsyncTwin):
    """``sandbox.commands`` for asyncio."""


@async_twin_of(Files)
class AsyncFiles(AsyncTwin):
    """``sandbox.files`` for asyncio; ``read(format="stream")`` gives an async iterator."""


@async_twin_of(PtyHandle)
class AsyncPtyHandle(AsyncTwin):
    """A terminal (``await handle.send_input(...)``, ``await handle.wait()``...)."""

    pid: int


@async_twin_of(Pty)
class AsyncPty(AsyncTwin):
    """``sandbox.pty`` for asyncio; ``on_data`` may be a coroutine function."""


@async_twin_of(Sandbox)
class AsyncSandbox(AsyncTwin):
    """A sandbox driven from asyncio: ``await AsyncSandbox.create()``, ``async with``."""

    commands: AsyncCommands
    files: AsyncFiles
    pty: AsyncPty

    # Read by the MCP server (agent/): the provider, and the info last fetched (no I/O).
    @property
    def _provider(self) -> Provider:
        return self._sync._provider  # type: ignore[no-any-return]

    @property
    def _info(self) -> SandboxInfo:
        return self._sync._info  # type: ignore[no-any-return]
