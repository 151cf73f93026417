"""The file tools: read_file, write_file, list_files."""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Any

from agent_sandbox.agent.tool_args import ListFilesArgs, ReadFileArgs, WriteFileArgs
from agent_sandbox.agent.toolkit import CallContext, ToolOutput, ToolSpec, sandbox_for
from agent_sandbox.errors import InvalidArgumentError


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
    pos = 0
    more = False
    async for chunk in await sb.files.read(path, format="stream"):
        start = max(0, offset - pos)
        pos += len(chunk)
        if start < len(chunk):
            buf += chunk[start:]
        if len(buf) > want:
            more = True
            break
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
                            "next_offset": offset + size if more else None}
    text = content
    if more:
        why = "output budget reached" if cut_by_budget else "limit reached"
        text += (f"\n[... {why}; the file continues: read_file with offset={offset + size} "
                 "to read on ...]")
    return ToolOutput(text, info)


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
    size = await sb.files.write(path, data, mode=mode)
    return ToolOutput(f"Wrote {size} bytes to {path} (mode {mode:04o}).",
                      {"sandbox_id": sb.sandbox_id, "path": path, "bytes": size,
                       "mode": f"{mode:04o}"})


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
        rows.append(e.model_dump())
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
    "next_offset to continue.",
    ReadFileArgs, read_file, read_only=True)

WRITE_FILE = ToolSpec(
    "write_file",
    "Create or replace a file in a sandbox (parent directories are made). Content is UTF-8 "
    "text, or base64 with encoding='base64' for binary data. Returns the size written.",
    WriteFileArgs, write_file)

LIST_FILES = ToolSpec(
    "list_files",
    "List a directory in a sandbox: type, permissions, size and path of each entry. depth > 1 "
    "descends into subdirectories.",
    ListFilesArgs, list_files, read_only=True)
