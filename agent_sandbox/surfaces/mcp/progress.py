"""Streaming command output to the client as MCP progress notifications.

Output callbacks run in the SDK's worker thread; they must not block on the network, so
they only enqueue. One task per call drains the queue in order and sends notifications.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

MAX_CHUNK = 16 * 1024  # one notification carries at most this much output

Send = Callable[[float, str], Awaitable[None]]  # (progress so far, message)


class ProgressStreamer:
    def __init__(self, send: Send) -> None:
        self._send = send
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        self._sent = 0
        self._task = self._loop.create_task(self._drain())

    def push(self, stream: str, text: str) -> None:
        """Thread-safe, non-blocking."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (stream, text))

    async def _drain(self) -> None:
        while (item := await self._queue.get()) is not None:
            stream, text = item
            for i in range(0, len(text), MAX_CHUNK):
                piece = text[i:i + MAX_CHUNK]
                self._sent += len(piece)
                prefix = "[stderr] " if stream == "stderr" else ""
                with contextlib.suppress(Exception):  # progress is advisory
                    await self._send(float(self._sent), prefix + piece)

    async def close(self) -> None:
        # Let callbacks already scheduled from the worker thread land first.
        await asyncio.sleep(0)
        self._queue.put_nowait(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 5)
