"""The STDIO server's first moments: stdin read and ``initialize`` answered before the
MCP SDK (about a second of imports on a small host) is even loaded.

An IDE waits for the ``initialize`` answer on every start. So the entry point claims the
standard descriptors, starts reading stdin in a daemon thread and, if the first line is a
plain handshake ``initialize``, answers it at once from what is known without the SDK:
our name, version, instructions and capabilities, and the version to speak (the client's
if it is one we speak, else 2024-11-05, as the SDK does after ``settle_initialize``).
The line is still handed to the SDK when it is ready, so the session is initialized the
usual way; the SDK's own answer to it is dropped (``swallow``). Anything this module is
unsure of (odd ids, an oversized line, modern-era metadata) is left to the SDK.

Stdlib only, on purpose: importing anything heavy here would defeat it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any

from agent_sandbox.surfaces.mcp.identity import CAPABILITIES, INSTRUCTIONS, SERVER_NAME, version

# mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS, spelled out (importing it costs ~0.5 s);
# a unit test keeps the two equal.
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
STDIO_DEFAULT_VERSION = "2024-11-05"
_READ_CHUNK = 1 << 16
_EARLY_LINE_MAX = 64 * 1024  # a longer first line is left to the SDK's checks
_MAX_ID = (1 << 63) - 1


def claim_fd(fd: int, diversion: int) -> int:
    """Take ``fd`` for the wire; point the standard descriptor at ``diversion``."""
    private = os.dup(fd)
    os.set_inheritable(private, False)
    os.dup2(diversion, fd)
    return private


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def early_answer(line: bytes) -> tuple[Any, dict[str, Any]] | None:
    """(id, the answer) if ``line`` is an ``initialize`` we can answer alone, else None."""
    if len(line) > _EARLY_LINE_MAX:
        return None
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" \
            or msg.get("method") != "initialize":
        return None
    msg_id, params = msg.get("id"), msg.get("params", {})
    plain_id = (isinstance(msg_id, int) and not isinstance(msg_id, bool)
                and abs(msg_id) <= _MAX_ID) or (isinstance(msg_id, str) and msg_id.isascii()
                                                and len(msg_id) <= 200)
    if not plain_id or not isinstance(params, dict) or "_meta" in params:
        return None
    asked = params.get("protocolVersion")
    answer = {"jsonrpc": "2.0", "id": msg_id, "result": {
        "capabilities": CAPABILITIES, "instructions": INSTRUCTIONS,
        "protocolVersion": asked if asked in HANDSHAKE_VERSIONS else STDIO_DEFAULT_VERSION,
        "serverInfo": {"name": SERVER_NAME, "version": version()}}}
    return msg_id, answer


class EarlyStdio:
    """The process's stdin/stdout, claimed at start: fd 0 then reads /dev/null and fd 1
    goes to stderr, so stray prints never corrupt the wire.

    A daemon thread reads stdin (a read blocked on stdin cannot be interrupted; in a
    non-daemon thread it would keep the process alive after SIGTERM). Chunks wait in a
    buffer until ``attach`` hands them to the event loop; a few are read ahead at most.
    """

    def __init__(self, stdin_fd: int = 0, stdout_fd: int = 1, ahead: int = 16) -> None:
        devnull = os.open(os.devnull, os.O_RDONLY)
        self.in_fd = claim_fd(stdin_fd, devnull)
        os.close(devnull)
        self.out_fd = claim_fd(stdout_fd, 2)
        self.swallow: set[str] = set()  # reply ids (json) the SDK's answer is dropped for
        self.answered_early: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._held: list[bytes] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[bytes] | None = None
        self._room = threading.Semaphore(ahead)
        threading.Thread(target=self._run, name="abx-mcp-stdin", daemon=True).start()

    def _run(self) -> None:
        first = bytearray()
        looking = True  # until the first line is complete (or too long to matter)
        while True:
            self._room.acquire()
            try:
                data = os.read(self.in_fd, _READ_CHUNK)
            except OSError:
                data = b""
            if looking and data:
                first += data
                if b"\n" in first or len(first) > _EARLY_LINE_MAX:
                    looking = False
                    self._answer_first(bytes(first.split(b"\n", 1)[0]))
            self._deliver(data)
            if not data:
                return

    def _answer_first(self, line: bytes) -> None:
        found = early_answer(line)
        if found is None:
            return
        msg_id, answer = found
        key = json.dumps(msg_id)
        try:
            write_all(self.out_fd, json.dumps(answer, separators=(",", ":")).encode() + b"\n")
        except OSError:
            return  # the client is gone; the SDK will see EOF
        self.swallow.add(key)
        self.answered_early[key] = answer["result"]

    def _deliver(self, data: bytes) -> None:
        with self._lock:
            if self._loop is None or self._queue is None:
                self._held.append(data)
                return
            loop, queue = self._loop, self._queue
        loop.call_soon_threadsafe(queue.put_nowait, data)

    def attach(self) -> None:
        """Start handing chunks to the running event loop (what came before, first)."""
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        with self._lock:
            for data in self._held:
                queue.put_nowait(data)
            self._held.clear()
            self._loop, self._queue = asyncio.get_running_loop(), queue

    async def read(self) -> bytes:
        """The next chunk; b"" at EOF."""
        assert self._queue is not None, "attach() first"
        data = await self._queue.get()
        self._room.release()
        return data

    def close(self) -> None:
        for fd in (self.in_fd, self.out_fd):
            try:
                os.close(fd)
            except OSError:
                pass
