"""A directory as a tar stream, produced piece by piece (stdlib only, Python >= 3.9).

Shared by the guest (``files.download_dir``: the sandbox's tree goes out) and the host
(``files.upload_dir``: the user's tree goes in); ``dir_unpack`` is the other end. The
tree is walked through directory descriptors, every entry opened relative to its parent
with ``O_NOFOLLOW``: a symlink is sent as a link, never followed, whatever is swapped in
while the walk runs. Only directories, regular files and symlinks are sent; anything
else (sockets, fifos, devices) is skipped with a note, and the notes travel at the end
of the stream (a pax record ``ABX.skipped`` on a final ``./`` entry), so the receiver
reports them with its own. Hard links are sent as separate copies. The guest stays on
the directory's file system (``one_fs``): /proc, /sys, /dev or a volume below it are
skipped with a note, as ``tar --one-file-system`` does.

Headers are ``tarfile.TarInfo.tobuf`` in pax format (any name length, any size, names
that are not UTF-8 kept byte for byte); the stream is a generator so a caller can pull
one chunk at a time: nothing is ever held but the chunk in hand.
"""

from __future__ import annotations

import json
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of the guest's startup
    from typing import Iterator, List, Optional

CHUNK = 1 << 20  # bytes per piece of the stream (the guest's frame payload size)
BLOCK = 512
RECORD = 20 * BLOCK
MAX_DEPTH = 256  # directories below the root; deeper ones are skipped with a note
TRAILER_KEY = "ABX.skipped"  # pax record of the final ./ entry: the sender's notes
MAX_NOTES = 100  # notes kept in full; the rest are counted
MAX_NOTE = 300  # characters of one note
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class ArchiveError(Exception):
    """The archive cannot be used at all (corrupt, hostile beyond one member, over a
    limit): the transfer stops. ``limit`` tells a cap the caller set from a bad stream."""

    def __init__(self, message: str, limit: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit


class Notes:
    """What was skipped, and why: the first ``MAX_NOTES`` in full, the rest counted."""

    def __init__(self) -> None:
        self.items: List[str] = []
        self.more = 0

    def add(self, text: str) -> None:
        if len(self.items) < MAX_NOTES:
            self.items.append(text[:MAX_NOTE])
        else:
            self.more += 1

    def extend(self, texts: List[str]) -> None:
        for text in texts:
            self.add(text)

    def as_list(self) -> List[str]:
        tail = [f"... and {self.more} more skipped"] if self.more else []
        return self.items + tail


def shown(name: str) -> str:
    """A member name for a note: control characters and undecodable bytes escaped."""
    text = repr(name)[1:-1] if not name.isprintable() else name
    return text[:200]


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISSOCK, "a socket"), (stat.S_ISFIFO, "a fifo"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def _header(name: str, kind: bytes, st: os.stat_result, size: int = 0,
            link: str = "", pax: object = None) -> bytes:
    import tarfile

    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode) if st is not None else 0o755
    info.mtime = max(0, int(st.st_mtime)) if st is not None else 0
    info.size = size
    info.linkname = link
    info.uid = info.gid = 0  # never the sender's ids or names
    info.uname = info.gname = ""
    if pax:
        info.pax_headers = pax  # type: ignore[assignment]
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class _Out:
    """Joins small pieces up to CHUNK bytes; big file reads pass through unjoined."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.offset = 0

    def add(self, data: bytes) -> Iterator[bytes]:
        self.offset += len(data)
        if len(data) >= CHUNK // 2:
            if self.buf:
                yield bytes(self.buf)
                self.buf.clear()
            yield data
            return
        self.buf += data
        if len(self.buf) >= CHUNK:
            yield bytes(self.buf)
            self.buf.clear()

    def flush(self) -> Iterator[bytes]:
        if self.buf:
            yield bytes(self.buf)
            self.buf.clear()


def pack(root_fd: int, notes: Notes, one_fs: bool = False) -> Iterator[bytes]:
    """The tree under the directory ``root_fd`` (not closed here) as tar chunks, member
    names relative to it; the root itself is not a member. Skipped entries go to
    ``notes`` and into the stream's trailer. ``one_fs``: directories of other file systems
    (mount points: /proc, /sys, a volume) are skipped, as ``tar --one-file-system``."""
    out = _Out()
    fd = os.dup(root_fd)
    dev = os.fstat(fd).st_dev if one_fs else None
    yield from _walk(out, fd, "", 0, notes, dev)  # _walk closes fd
    if notes.items:
        pax = {TRAILER_KEY: json.dumps(notes.as_list())}
        yield from out.add(_header("./", b"5", None, pax=pax))  # type: ignore[arg-type]
    end = 2 * BLOCK
    end += (-(out.offset + end)) % RECORD  # whole records, as tar(1) writes them
    yield from out.add(bytes(end))
    yield from out.flush()


def _walk(out: _Out, fd: int, prefix: str, depth: int, notes: Notes,
          dev: Optional[int]) -> Iterator[bytes]:
    try:
        try:
            names = sorted(os.listdir(fd))
        except OSError as exc:
            notes.add(f"{shown(prefix or '.')}: cannot be listed ({exc.strerror}); skipped")
            return
        for name in names:
            rel = prefix + name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # gone while we walked
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                yield from _symlink(out, fd, name, rel, st, notes)
            elif stat.S_ISREG(mode):
                yield from _file(out, fd, name, rel, notes)
            elif stat.S_ISDIR(mode):
                if depth >= MAX_DEPTH:
                    notes.add(f"{shown(rel)}: more than {MAX_DEPTH} directories deep; skipped")
                    continue
                if dev is not None and st.st_dev != dev:
                    notes.add(f"{shown(rel)}: another file system (a mount point); skipped")
                    continue
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    notes.add(f"{shown(rel)}: cannot be opened ({exc.strerror}); skipped")
                    continue
                yield from out.add(_header(rel, b"5", os.fstat(sub)))
                yield from _walk(out, sub, rel + "/", depth + 1, notes, dev)
            else:
                notes.add(f"{shown(rel)}: {_kind(mode)}; skipped (only files, directories "
                          "and symlinks are copied)")
    finally:
        os.close(fd)


def _symlink(out: _Out, fd: int, name: str, rel: str, st: os.stat_result,
             notes: Notes) -> Iterator[bytes]:
    try:
        target = os.readlink(name, dir_fd=fd)
    except OSError:
        return  # replaced by something else while we walked
    yield from out.add(_header(rel, b"2", st, link=target))


def _file(out: _Out, fd: int, name: str, rel: str, notes: Notes) -> Iterator[bytes]:
    try:
        src = os.open(name, _FILE_FLAGS, dir_fd=fd)
    except OSError as exc:
        notes.add(f"{shown(rel)}: cannot be read ({exc.strerror}); skipped")
        return
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):  # swapped for a fifo or device meanwhile
            notes.add(f"{shown(rel)}: {_kind(st.st_mode)}; skipped")
            return
        os.set_blocking(src, True)
        yield from out.add(_header(rel, b"0", st, size=st.st_size))
        left = st.st_size
        short = False
        while left:
            try:
                data = os.read(src, min(CHUNK, left))
            except OSError:
                data = b""
            if not data:  # shrank (or failed) while read: the header promised the size
                short = True
                data = bytes(min(CHUNK, left))
            left -= len(data)
            yield from out.add(data)
        if short:
            notes.add(f"{shown(rel)}: changed or failed while being read; its end is "
                      "zero bytes")
        yield from out.add(bytes((-st.st_size) % BLOCK))
    finally:
        os.close(src)
