"""The file tools: read_file, write_file, list_files, lock_file, unlock_file."""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.surfaces.mcp.tool_args import (
    ListFilesArgs,
    LockFileArgs,
    ReadFileArgs,
    UnlockFileArgs,
    WriteFileArgs,
)
from agent_sandbox.surfaces.mcp.toolkit import CallContext, ToolOutput, ToolSpec, sandbox_for


def _abs(path: str) -> str:
    """Relative paths are taken from /workspace, as the descriptions promise."""
    return path if path.startswith("/") else posixpath.join("/workspace", path)


def _decode_utf8(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(data) - 3:  # a character cut by offset/limit: drop its bytes
            return data[:exc.start].decode("utf-8")
        raise InvalidArgumentError(f"{path} is not UTF-8 text (byte {exc.start}); read it with "
                                   "encoding='base64'") from None


async def read_file(ctx: CallContext, a: ReadFileArgs) -> ToolOutput:
    path = _abs(a.path)
    encoding, offset, limit = a.encoding, a.offset, a.limit
    budget = ctx.config.output_budget if encoding == "utf-8" else ctx.config.output_budget * 3 // 4
    want = budget if limit is None else min(limit, budget)
    sb = await sandbox_for(ctx, a.sandbox_id)
    buf = bytearray()
    more = False
    chunks = await sb.files.read(path, format="stream", offset=offset)
    version = getattr(chunks, "version", None)
    try:
        async for chunk in chunks:
            buf += chunk
            if len(buf) > want:
                more = True
                break
    finally:
        await chunks.aclose()
    data = bytes(buf[:want])
    if encoding == "utf-8":
        content = _decode_utf8(data, path)
        size = len(content.encode())
    else:
        content = base64.b64encode(data).decode()
        size = len(data)
    cut_by_budget = more and (limit is None or limit > budget)
    info: dict[str, Any] = {"sandbox_id": sb.sandbox_id, "path": path, "encoding": encoding,
                            "offset": offset, "bytes": size, "content": content,
                            "truncated": cut_by_budget,
                            "next_offset": offset + size if more else None,
                            "version": version}
    text = content
    if more:
        why = "output budget reached" if cut_by_budget else "limit reached"
        text += (f"\n[... {why}; the file continues: read_file with offset={offset + size} "
                 "to read on ...]")
    notes = [f"[version {version}: write_file with if_match='{version}' replaces the file "
             "only if nobody changed it since this read]"] if version else []
    return ToolOutput(text, info, notes=notes)


async def write_file(ctx: CallContext, a: WriteFileArgs) -> ToolOutput:
    path = _abs(a.path)
    mode = a.mode
    if a.encoding == "base64":
        try:
            data: str | bytes = base64.b64decode(a.content, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgumentError("write_file: 'content' is not valid base64") from None
    else:
        data = a.content
    sb = await sandbox_for(ctx, a.sandbox_id)
    size = await sb.files.write(path, data, mode=mode, if_match=a.if_match,
                                lock_wait=a.lock_wait, lock=a.lock_token)
    return ToolOutput(f"Wrote {size} bytes to {path} (mode {mode:04o}).",
                      {"sandbox_id": sb.sandbox_id, "path": path, "bytes": size,
                       "mode": f"{mode:04o}"})


async def lock_file(ctx: CallContext, a: LockFileArgs) -> ToolOutput:
    path = _abs(a.path)
    sb = await sandbox_for(ctx, a.sandbox_id)
    held = await sb.files.lock(path, a.ttl, wait=a.wait, holder=ctx.session.holder,
                               renew=a.renew)
    ctx.session.locked_in(sb)  # released when the session ends
    return ToolOutput(
        f"Locked {path} for {held.expires_in:g} s (token {held.token}). Pass "
        f"lock_token='{held.token}' to write_file; unlock_file when done; lock_file with "
        "renew=<token> to extend it.",
        {"sandbox_id": sb.sandbox_id, **held.model_dump()})


async def unlock_file(ctx: CallContext, a: UnlockFileArgs) -> ToolOutput:
    path = _abs(a.path)
    sb = await sandbox_for(ctx, a.sandbox_id)
    await sb.files.unlock(a.token, path)
    return ToolOutput(f"Unlocked {path}.", {"sandbox_id": sb.sandbox_id, "path": path,
                                            "unlocked": True})


async def list_files(ctx: CallContext, a: ListFilesArgs) -> ToolOutput:
    path = _abs(a.path)
    depth = a.depth
    sb = await sandbox_for(ctx, a.sandbox_id)
    entries = await sb.files.list(path, depth=depth)
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    used = 0
    for e in entries:
        line = f"{e.type:7} {e.mode & 0o7777:04o} {e.size:>10} {e.path}" + (
            f" -> {e.symlink_target}" if e.symlink_target else "")
        used += len(line) + 1
        if used > ctx.config.output_budget:
            break
        lines.append(line)
        rows.append(e.model_dump(exclude_none=True))  # no null: see tool_results
    cut_note = len(rows) < len(entries)
    text = "\n".join(lines) if lines else f"{path} is empty."
    if cut_note:
        text += f"\n[... {len(entries) - len(rows)} more entries cut: list a subdirectory ...]"
    return ToolOutput(text, {"sandbox_id": sb.sandbox_id, "path": path, "entries": rows,
                             "truncated": cut_note, "total": len(entries)})


READ_FILE = ToolSpec(
    "read_file",
    "Read a file from a sandbox. Text comes back as UTF-8; use encoding='base64' for binary "
    "files. Large files are returned in pieces: use offset and limit (bytes), and the result's "
    "next_offset to continue. The result gives the file's version: to edit the file, pass it "
    "to write_file as if_match.",
    ReadFileArgs, read_file, read_only=True)

WRITE_FILE = ToolSpec(
    "write_file",
    "Create or replace a file in a sandbox (parent directories are made). Content is UTF-8 "
    "text, or base64 with encoding='base64' for binary data. Returns the size written. "
    "Others (agents, people, scripts) may edit the same file: to change a file you read, "
    "pass the version read_file gave as if_match; a 'conflict' error means it changed "
    "since, so read it again and redo your change. A 'locked' error means another task is "
    "writing it: retry after retry_after seconds, or tell the user the file is being "
    "edited by another task.",
    WriteFileArgs, write_file)

LOCK_FILE = ToolSpec(
    "lock_file",
    "Lock a file for an edit of several steps: until unlock_file, the ttl (seconds) runs "
    "out, or this session ends, other writers get a 'locked' error naming you. Pass the "
    "token to write_file as lock_token. Locks bind writers using this service, not "
    "programs running inside the sandbox.",
    LockFileArgs, lock_file)

UNLOCK_FILE = ToolSpec(
    "unlock_file",
    "Release a lock_file lock (its path and token) so others can write the file.",
    UnlockFileArgs, unlock_file)

LIST_FILES = ToolSpec(
    "list_files",
    "List a directory in a sandbox: type, permissions, size and path of each entry. depth > 1 "
    "descends into subdirectories.",
    ListFilesArgs, list_files, read_only=True)
