"""Hand-made tar streams, honest and hostile, for the directory-transfer tests."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_sandbox.guest.dir_pack import Notes, pack
from agent_sandbox.guest.dir_unpack import Unpacker


def member(name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE, link: str = "",
           mode: int = 0o644, size: int | None = None, pax: dict[str, str] | None = None,
           fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """One member: its header (``name`` as given, absolute or not) and padded data."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = mode
    info.size = len(data) if size is None else size
    if pax:
        info.pax_headers = pax
    head = info.tobuf(fmt, "utf-8", "surrogateescape")
    return head + data + bytes(-len(data) % 512)


END = bytes(1024)


def stream(*members: bytes, end: bool = True) -> bytes:
    return b"".join(members) + (END if end else b"")


def chunks_of(data: bytes, size: int = 7000) -> Iterator[bytes]:
    """Odd-sized pieces: no header or file lines up with a chunk."""
    for start in range(0, len(data), size):
        yield data[start:start + size]


def unpack(dest: Path, data: bytes | Iterator[bytes], *, max_bytes: int | None = None,
           **kw: Any) -> dict[str, Any]:
    dest.mkdir(parents=True, exist_ok=True)
    pieces = chunks_of(data) if isinstance(data, bytes) else data
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return Unpacker(fd, Notes(), **kw).run(lambda: next(pieces, b""), max_bytes)
    finally:
        os.close(fd)


def packed(src: Path) -> tuple[bytes, list[str]]:
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    notes = Notes()
    try:
        return b"".join(pack(fd, notes)), notes.as_list()
    finally:
        os.close(fd)


def tree(root: Path) -> dict[str, tuple[str, Any, int]]:
    """Every entry under root: kind, content (or link target) and permission bits."""
    out: dict[str, tuple[str, Any, int]] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path), 0)
            elif path.is_dir():
                out[rel] = ("dir", None, st.st_mode & 0o7777)
            elif path.is_file():
                out[rel] = ("file", path.read_bytes(), st.st_mode & 0o7777)
            else:
                out[rel] = ("other", None, 0)
    return out
