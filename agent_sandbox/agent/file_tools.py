"""The file tools: read_file, write_file, list_files."""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Any

from agent_sandbox.agent.args import Args
from agent_sandbox.agent.toolkit import (
    MAX_BYTE,
    PATH,
    SANDBOX_ID,
    CallContext,
    ToolOutput,
    ToolSpec,
    sandbox_for,
)
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


async def read_file(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("read_file", raw, READ_FILE.properties)
    path = _abs(a.str("path", required=True))
    encoding = a.choice("encoding", ("utf-8", "base64"))
    offset = a.num("offset", 0)
    limit = a.num("limit")
    budget = ctx.config.output_budget if encoding == "utf-8" else ctx.config.output_budget * 3 // 4
    want = budget if limit is None else min(limit, budget)
    sb = await sandbox_for(ctx, a.str("sandbox_id"))
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


async def write_file(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("write_file", raw, WRITE_FILE.properties)
    path = _abs(a.str("path", required=True))
    content = a.str("content", required=False)
    if content is None:
        raise InvalidArgumentError("write_file: 'content' is required (may be empty)")
    encoding = a.choice("encoding", ("utf-8", "base64"))
    mode = a.mode()
    if encoding == "base64":
        try:
            data: str | bytes = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgumentError("write_file: 'content' is not valid base64") from None
    else:
        data = content
    sb = await sandbox_for(ctx, a.str("sandbox_id"))
    size = await sb.files.write(path, data, mode=mode)
    return ToolOutput(f"Wrote {size} bytes to {path} (mode {mode:04o}).",
                      {"sandbox_id": sb.sandbox_id, "path": path, "bytes": size,
                       "mode": f"{mode:04o}"})


async def list_files(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("list_files", raw, LIST_FILES.properties)
    path = _abs(a.str("path", "/workspace"))
    depth = a.num("depth", 1)
    sb = await sandbox_for(ctx, a.str("sandbox_id"))
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
    {"path": {**PATH, "description": "Absolute path, or relative to /workspace."},
     "encoding": {"type": "string", "enum": ["utf-8", "base64"], "description": "Default "
                  "utf-8."},
     "offset": {"type": "integer", "minimum": 0, "maximum": MAX_BYTE,
                "description": "First byte to read (default 0)."},
     "limit": {"type": "integer", "minimum": 1, "maximum": MAX_BYTE,
               "description": "Most bytes to read."},
     "sandbox_id": SANDBOX_ID},
    read_file, required=("path",), read_only=True)

WRITE_FILE = ToolSpec(
    "write_file",
    "Create or replace a file in a sandbox (parent directories are made). Content is UTF-8 "
    "text, or base64 with encoding='base64' for binary data. Returns the size written.",
    {"path": {**PATH, "description": "Absolute path, or relative to /workspace."},
     "content": {"type": "string", "description": "The whole new content."},
     "encoding": {"type": "string", "enum": ["utf-8", "base64"], "description": "Default "
                  "utf-8."},
     "mode": {"type": ["string", "integer"], "minimum": 0, "maximum": 0o7777,
              "description": "Permissions as an octal string, "
              "e.g. '0755' (default '0644'); an integer is taken as the numeric value (420)."},
     "sandbox_id": SANDBOX_ID},
    write_file, required=("path", "content"))

LIST_FILES = ToolSpec(
    "list_files",
    "List a directory in a sandbox: type, permissions, size and path of each entry. depth > 1 "
    "descends into subdirectories.",
    {"path": {**PATH, "description": "Directory (default /workspace)."},
     "depth": {"type": "integer", "minimum": 1, "maximum": 64,
               "description": "Levels to descend (default 1)."},
     "sandbox_id": SANDBOX_ID},
    list_files, read_only=True)
