"""A bounded STDIO transport: newline-delimited JSON-RPC with strict framing.

Unlike the SDK's stdio server it caps a message (8 MiB by default: a longer line gets an
error and the next line is served), checks every line with ``wire_guard`` (depth, encoding,
surrogates, ids, batches: bad input is answered with a JSON-RPC error, never dropped and
never fatal), and settles the handshake version the STDIO way (missing or unsupported ->
2024-11-05). Replies that cannot be encoded are still sent (see ``encode``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp_types import INTERNAL_ERROR

from agent_sandbox.surfaces.mcp import wire_guard
from agent_sandbox.surfaces.mcp.config import STDIO_MAX_MESSAGE
from agent_sandbox.surfaces.mcp.early_stdio import EarlyStdio, write_all
from agent_sandbox.surfaces.mcp.wire_guard import settle_initialize

_READ_CHUNK = 1 << 16
# Checking a line this long takes a while: do it off the event loop (pings keep flowing).
_CHECK_IN_THREAD = 256 * 1024
# At EOF, requests already read are finished and answered for at most this long.
DRAIN_TIMEOUT_S = 30.0
log = logging.getLogger("agent_sandbox.surfaces.mcp")
# A reply the reader answers by itself, already encoded (an error, or a batch's errors).
Reply = bytes


def parse_line(line: bytes, limit: int = STDIO_MAX_MESSAGE) -> SessionMessage | Reply:
    """One line of input -> the message to serve, or the encoded reply to answer with."""
    verdict = wire_guard.inspect(line, limit)
    if verdict.message is None:
        return wire_guard.dumps(verdict.reply)
    obj = verdict.message
    if obj.get("method") == "initialize":
        settle_initialize(obj)
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(obj, by_name=False))
    except Exception:  # noqa: BLE001 - pydantic's error would echo the payload
        return wire_guard.dumps(wire_guard.error(
            wire_guard.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message",
            obj.get("id") if wire_guard.valid_id(obj.get("id")) else None))


def encode(msg: SessionMessage) -> bytes:
    """A message for the wire. Never raises: a reply that cannot be encoded as it is (a
    stray unpaired surrogate) is sent with the bad characters replaced, or as an error."""
    try:
        return msg.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
    except Exception:  # noqa: BLE001
        log.exception("could not encode a reply; sending it with bad characters replaced")
    try:
        data = msg.message.model_dump(by_alias=True, exclude_unset=True)
        return json.dumps(data, ensure_ascii=False, default=str).encode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        msg_id = getattr(msg.message, "id", None)
        return wire_guard.dumps(wire_guard.error(
            INTERNAL_ERROR, "Internal error: the reply could not be encoded", msg_id))


class LineReader:
    """Splits a byte stream into lines of at most ``limit`` bytes (newline excluded); an
    oversized line comes out as the encoded error reply that answers it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._skipping = False  # inside an oversized line: drop bytes up to its newline
        self._skipped_head = b""

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        """(line, False) for a line to parse, (reply, True) for an answer ready to send."""
        out: list[tuple[bytes, bool]] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._take(data[start:])
                return out
            self._take(data[start:nl])
            if self._skipping:
                reply = wire_guard.error(
                    wire_guard.INVALID_REQUEST, f"Invalid Request: message larger than "
                    f"{self.limit} bytes", wire_guard.id_near_start(self._skipped_head))
                out.append((wire_guard.dumps(reply), True))
                self._skipping = False
            elif self._buf.strip():
                out.append((bytes(self._buf), False))
            self._buf.clear()
            start = nl + 1

    def _take(self, piece: bytes) -> None:
        if self._skipping or not piece:
            return
        self._buf += piece
        if len(self._buf) > self.limit:
            self._skipping = True
            self._skipped_head = bytes(self._buf[:1024])
            self._buf.clear()


async def read_one(line: bytes, limit: int) -> SessionMessage | Reply:
    """Check and parse one line; whatever goes wrong, the answer is an error reply."""
    try:
        if len(line) > _CHECK_IN_THREAD:
            return await anyio.to_thread.run_sync(parse_line, line, limit)
        return parse_line(line, limit)
    except Exception:  # noqa: BLE001 - the reader must outlive any message
        log.exception("could not read a message")
        return wire_guard.dumps(wire_guard.error(
            INTERNAL_ERROR, "Internal error: the message could not be read"))


class InFlight:
    """The ids of requests handed to the server and not yet answered.

    At EOF the reader waits for these before closing the server's input: the SDK cancels
    every handler still running when its input ends, so a piped ``tools/list`` or
    ``tools/call`` followed by EOF would be answered "Connection closed".
    """

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._idle = anyio.Event()
        self._idle.set()

    @staticmethod
    def _key(msg_id: Any) -> str:
        return json.dumps(msg_id)

    def opened(self, msg: SessionMessage) -> None:
        m = msg.message
        if isinstance(m, types.JSONRPCRequest):
            self._ids.add(self._key(m.id))
            if self._idle.is_set():
                self._idle = anyio.Event()
        elif isinstance(m, types.JSONRPCNotification) and m.method == "notifications/cancelled":
            rid = (m.params or {}).get("requestId")
            # A cancelled request is never answered (spec); the SDK coerces "1" to 1.
            for key in {self._key(rid), self._key(str(rid))}:
                self._close(key)
            if isinstance(rid, str) and rid.isdigit():
                self._close(self._key(int(rid)))

    def answered(self, msg: SessionMessage) -> None:
        m = msg.message
        if isinstance(m, types.JSONRPCResponse | types.JSONRPCError):
            self._close(self._key(m.id))

    def abandon(self) -> None:
        """Nothing can be answered any more (the client stopped reading)."""
        self._ids.clear()
        self._idle.set()

    def _close(self, key: str) -> None:
        self._ids.discard(key)
        if not self._ids:
            self._idle.set()

    async def drained(self, timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            await self._idle.wait()
            return True
        log.warning("EOF: %d request(s) still running after %g s are abandoned",
                    len(self._ids), timeout)
        return False


@asynccontextmanager
async def bounded_stdio(
        wire: EarlyStdio, limit: int = STDIO_MAX_MESSAGE, drain_timeout: float = DRAIN_TIMEOUT_S,
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]]:
    """Serve over the process's stdin/stdout, claimed (and maybe ``initialize`` answered)
    by ``wire`` at start."""
    out_fd = wire.out_fd
    wire.attach()
    read_send, read_recv = anyio.create_memory_object_stream[Any](64)
    # The server sends SessionMessages; the reader sends its own encoded replies.
    write_send, write_recv = anyio.create_memory_object_stream[Any](64)
    writer_done = anyio.Event()
    in_flight = InFlight()

    async def reader(replies: MemoryObjectSendStream[Any]) -> None:
        lines = LineReader(limit)
        async with read_send, replies:
            while data := await wire.read():  # b"" is EOF: the session ends
                for item, answered in lines.feed(data):
                    msg = item if answered else await read_one(item, limit)
                    if isinstance(msg, bytes):
                        await replies.send(msg)  # bad input is answered right here
                    else:
                        in_flight.opened(msg)
                        await read_send.send(msg)
            # EOF: what was already asked is still answered, then the session ends.
            await in_flight.drained(drain_timeout)

    async def writer() -> None:
        try:
            async with write_recv:
                async for msg in write_recv:
                    if not isinstance(msg, bytes) and _answered_early(wire, msg):
                        in_flight.answered(msg)
                        continue
                    payload = msg if isinstance(msg, bytes) else encode(msg)
                    await anyio.to_thread.run_sync(write_all, out_fd, payload + b"\n")
                    if not isinstance(msg, bytes):
                        in_flight.answered(msg)
        except OSError:
            pass  # the client is gone; EOF on stdin follows
        finally:
            in_flight.abandon()
            writer_done.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            async with anyio.create_task_group() as rtg:
                rtg.start_soon(reader, write_send.clone())
                try:
                    yield read_recv, write_send.clone()
                finally:
                    rtg.cancel_scope.cancel()
            # Let replies already queued reach the client before closing the wire.
            write_send.close()
            with anyio.move_on_after(3, shield=True):
                await writer_done.wait()
            tg.cancel_scope.cancel()
    finally:
        wire.close()


def _answered_early(wire: EarlyStdio, msg: SessionMessage) -> bool:
    """The SDK's answer to an ``initialize`` already answered by ``wire``: dropped."""
    m = msg.message
    if not isinstance(m, types.JSONRPCResponse | types.JSONRPCError):
        return False
    key = json.dumps(m.id)
    if key not in wire.swallow:
        return False
    wire.swallow.discard(key)
    sdk = m.model_dump(by_alias=True, exclude_unset=True).get("result")
    if sdk != wire.answered_early.get(key):
        log.warning("the early initialize answer differs from the SDK's: %s vs %s",
                    wire.answered_early.get(key), sdk)
    return True
