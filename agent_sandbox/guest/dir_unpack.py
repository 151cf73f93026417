"""A tar stream extracted under one directory and nowhere else (stdlib only, Python >= 3.9).

The host runs it on what a sandbox sends (``files.download_dir``: hostile input), the
guest on what the host sends (``files.upload_dir``, into a tree the sandbox may have
planted symlinks in). Either way every write lands under the target directory:

- member names that are absolute or contain ``..`` are refused (skipped with a note);
- each parent directory is opened relative to its own parent with ``O_NOFOLLOW``, so a
  member never goes through a symlink, whether the archive made it (``a -> /etc`` then
  ``a/passwd``) or it was there before; missing parents are made;
- files are written to a fresh temporary name (``O_CREAT|O_EXCL|O_NOFOLLOW``) and renamed
  over the member's name: a symlink standing there is replaced, never written through;
- symlinks are made as links (``outside_links=False`` skips those that point out of the
  tree); hard links, devices and fifos are skipped with a note;
- permissions are the archive's ``& 0o777`` (no setuid, setgid or sticky bit; a directory
  keeps ``u+rwx``), owners are never taken from it: what is made is the extracting
  process's or ``owner``'s (see ``owners``); with ``keep_owners`` a replaced file keeps
  its owner;
- the stream is read with ``tarfile`` in ``r|`` mode, a chunk at a time: extended headers
  are capped (``MAX_HEADER`` bytes, ``MAX_CHAIN`` in a row), global headers and sparse
  members refused, the end marker required, and the caller's ``max_bytes`` (archive
  bytes) and ``max_entries`` enforced.
"""

from __future__ import annotations

import errno
import json
import os
import tarfile

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of the guest's startup
    from typing import Any, Callable, Dict, List, Optional, Tuple

if __package__:
    from . import owners
    from .dir_pack import CHUNK, TRAILER_KEY, ArchiveError, Notes, shown
else:  # imported by the guest from its own directory
    import owners  # type: ignore[no-redef]
    from dir_pack import CHUNK, TRAILER_KEY, ArchiveError, Notes, shown  # type: ignore[no-redef]

MAX_HEADER = 64 << 10  # bytes of one pax or GNU long-name header
MAX_CHAIN = 4  # extended headers in front of one member
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Errors that spoil one member, not the transfer (the rest: disk full, I/O error, ...).
_MEMBER_ERRORS = (errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EEXIST, errno.EISDIR,
                  errno.ENOTDIR, errno.ELOOP, errno.EINVAL, errno.ENOTEMPTY, errno.EBUSY)


class _Member(tarfile.TarInfo):
    """``tarfile``'s header parsing, bounded: what a hostile stream could use to make the
    reader hold or loop on unbounded data is refused before it is read."""

    @classmethod
    def fromtarfile(cls, tar: Any) -> Any:
        try:
            return super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            tar.abx_ended = True  # a zero block: the end marker (tarfile stops quietly
            raise  # on a cut-off or garbled stream too, so it must be seen here)

    def _proc_member(self, tar: Any) -> Any:
        if self.type in (tarfile.XGLTYPE, tarfile.GNUTYPE_SPARSE):
            raise ArchiveError("the archive has a global header or a sparse member "
                               "(not sent by abx)")
        if self.type not in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE,
                             tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            return super()._proc_member(tar)
        chain = getattr(tar, "abx_chain", 0) + 1
        if self.size > MAX_HEADER:
            raise ArchiveError(f"the archive has an extended header of {self.size} bytes "
                               f"(at most {MAX_HEADER})")
        if chain > MAX_CHAIN:
            raise ArchiveError(f"the archive has {chain} extended headers in a row (at most "
                               f"{MAX_CHAIN})")
        tar.abx_chain = chain
        try:
            return super()._proc_member(tar)
        finally:
            tar.abx_chain = chain - 1

    def _proc_gnusparse_10(self, next: Any, pax_headers: Any, tar: Any) -> None:
        raise ArchiveError("the archive has a sparse member (not sent by abx)")


class _Reader:
    """``read(n)`` over ``pull`` (returns the next chunk, b"" at the end), counting what
    it hands out against ``max_bytes``."""

    def __init__(self, pull: Callable[[], bytes], max_bytes: Optional[int]) -> None:
        self._pull = pull
        self._buf = memoryview(b"")
        self.max_bytes = max_bytes
        self.taken = 0
        self.ended = False

    def read(self, n: int = -1) -> bytes:
        if not self._buf and not self.ended:
            chunk = self._pull()
            if not chunk:
                self.ended = True
            self._buf = memoryview(chunk)
        if n is None or n < 0:
            n = len(self._buf)
        data, self._buf = self._buf[:n], self._buf[n:]
        self.taken += len(data)
        if self.max_bytes is not None and self.taken > self.max_bytes:
            raise ArchiveError(f"the archive is larger than max_bytes={self.max_bytes}",
                               limit=True)
        return bytes(data)

    def drain(self, most: int) -> None:
        """Read to the end: padding after the end marker is fine, more is not."""
        left = most
        while not self.ended:
            left -= len(self.read(CHUNK))
            if left < 0:
                raise ArchiveError("the archive goes on after its end marker")


def _parts(name: str) -> Optional[List[str]]:
    """A member name's components below the target; None if it is absolute or has
    ``..`` in it (``[]`` is the target itself)."""
    if name.startswith("/") or "\x00" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return None if ".." in parts else parts


def _escapes(parts: List[str], target: str) -> bool:
    """Whether a symlink at ``parts`` pointing to ``target`` leads out of the tree."""
    if target.startswith("/"):
        return True
    depth = len(parts) - 1  # the link's directory, below the root
    for piece in target.split("/"):
        if piece == "..":
            depth -= 1
            if depth < 0:
                return True
        elif piece not in ("", "."):
            depth += 1
    return False


class _Skip(Exception):
    """This member is skipped; the message says why."""


class Unpacker:
    """Extracts one stream under ``root_fd`` (a directory descriptor, not closed here)."""

    def __init__(self, root_fd: int, notes: Notes, *, max_entries: Optional[int] = None,
                 outside_links: bool = False, owner: Optional[Tuple[int, int]] = None,
                 keep_owners: bool = False) -> None:
        self.root = root_fd
        self.notes = notes
        self.max_entries = max_entries
        self.outside_links = outside_links
        self.owner = owner  # (uid, gid) of what is made; None: the extracting process's
        self.keep_owners = keep_owners
        self.counts: Dict[str, int] = {"files": 0, "dirs": 0, "symlinks": 0, "bytes": 0}
        self._cached: Optional[List[str]] = None  # the last parent opened, and its fd
        self._cached_fd = -1

    def run(self, pull: Callable[[], bytes], max_bytes: Optional[int] = None) -> Dict[str, Any]:
        """Extract everything ``pull`` yields; returns the counts and ``skipped`` notes."""
        reader = _Reader(pull, max_bytes)
        try:
            self._extract(reader)
        except ArchiveError:
            raise
        except (tarfile.TarError, ValueError, OverflowError, RecursionError, MemoryError,
                UnicodeError) as exc:
            raise ArchiveError(f"the archive is not a valid tar stream: {exc}"[:300]) from None
        finally:
            self._forget()
        reader.drain(1 << 20)
        return dict(self.counts, skipped=self.notes.as_list())

    def _extract(self, reader: _Reader) -> None:
        with tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK,  # type: ignore[call-overload]
                          tarinfo=_Member, encoding="utf-8", errors="surrogateescape") as tar:
            seen = 0
            while True:
                member = tar.next()
                tar.members.clear()  # tarfile keeps every member it read: not here
                if member is None:
                    break
                seen += 1
                if self.max_entries is not None and seen > self.max_entries:
                    raise ArchiveError(f"the archive has more than max_entries="
                                       f"{self.max_entries} entries", limit=True)
                self._one(tar, member)
            if not getattr(tar, "abx_ended", False):
                raise ArchiveError("the archive ends without its end marker (cut off or "
                                   "garbled)")

    def _one(self, tar: Any, member: tarfile.TarInfo) -> None:
        try:
            self._member(tar, member)
        except _Skip as skip:
            self.notes.add(f"{shown(member.name)}: {skip}; skipped")
        except OSError as exc:
            if exc.errno not in _MEMBER_ERRORS:
                raise
            self.notes.add(f"{shown(member.name)}: {exc.strerror}; skipped")

    def _member(self, tar: Any, member: tarfile.TarInfo) -> None:
        parts = _parts(member.name)
        if parts is None:
            raise _Skip("an absolute name or one with '..' in it")
        if not parts:  # the target itself: only the sender's notes are taken from it
            if member.isdir():
                self._sender_notes(member.pax_headers.get(TRAILER_KEY))
                return
            raise _Skip("not a directory but names the target itself")
        if member.isdir():
            self._dir(parts, member)
        elif member.isreg():
            self._file(tar, parts, member)
        elif member.issym():
            self._symlink(parts, member)
        elif member.islnk():
            raise _Skip("a hard link (hard links are not extracted)")
        elif member.ischr() or member.isblk() or member.isfifo():
            raise _Skip("a device or fifo (only files, directories and symlinks are made)")
        else:
            raise _Skip(f"an unsupported entry type {member.type!r}")

    def _sender_notes(self, raw: Optional[str]) -> None:
        if raw is None:
            return
        try:
            items = json.loads(raw)
        except ValueError:
            items = None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            self.notes.add("the sender's list of skipped entries is malformed")
            return
        self.notes.extend([shown(i) for i in items[:200]])

    # -- where members go
    def _parent(self, parts: List[str]) -> int:
        """The directory ``parts`` below the root, opened component by component without
        following a symlink; missing ones are made."""
        if not parts:
            return self.root
        if parts == self._cached:
            return self._cached_fd
        self._forget()
        fd = self.root
        try:
            for i, name in enumerate(parts):
                nxt = self._open_dir(fd, name, "/".join(parts[: i + 1]))
                if fd != self.root:
                    os.close(fd)
                fd = nxt
        except BaseException:
            if fd != self.root:
                os.close(fd)
            raise
        self._cached, self._cached_fd = list(parts), fd
        return fd

    def _open_dir(self, parent: int, name: str, where: str, mode: int = 0o755,
                  last: bool = False) -> int:
        """The directory ``name`` in ``parent``, made if missing; a symlink or a file there
        is refused (``last``: the member itself is that directory)."""
        for attempt in (0, 1):
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if attempt:
                    raise
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = _is_link(parent, name)
                if last:
                    raise _Skip(f"a {'symlink' if link else 'file'} of that name is in the "
                                "way") from None
                if link:
                    raise _Skip(f"goes through the symlink {shown(where)}") from None
                raise _Skip(f"{shown(where)} is not a directory") from None
            else:
                return fd
            try:
                os.mkdir(name, mode, dir_fd=parent)
            except FileExistsError:
                continue  # made meanwhile: opened (and checked) again
            if self.owner is not None:
                owners.give_dir(name, self.owner, parent)
        raise AssertionError("unreachable")

    def _forget(self) -> None:
        if self._cached is not None:
            os.close(self._cached_fd)
        self._cached, self._cached_fd = None, -1

    def _not_a_dir_there(self, parent: int, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        import stat

        if stat.S_ISDIR(st.st_mode):
            raise _Skip("a directory of that name is in the way")

    # -- members
    def _dir(self, parts: List[str], member: tarfile.TarInfo) -> None:
        parent = self._parent(parts[:-1])
        fd = self._open_dir(parent, parts[-1], "/".join(parts), 0o700, last=True)
        try:
            os.fchmod(fd, (member.mode & 0o777) | 0o700)
        finally:
            os.close(fd)
        self.counts["dirs"] += 1

    def _file(self, tar: Any, parts: List[str], member: tarfile.TarInfo) -> None:
        parent = self._parent(parts[:-1])
        self._not_a_dir_there(parent, parts[-1])
        tmp = f".abx-{os.urandom(6).hex()}.part"
        fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=parent)
        try:
            try:
                data = tar.extractfile(member)
                left = member.size
                while left > 0:
                    chunk = data.read(min(CHUNK, left))
                    if not chunk:
                        raise ArchiveError("the archive ends inside a file")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                    left -= len(chunk)
                # A replaced file keeps its owner (keep_owners), a new one is owner's.
                owner = (owners.of_regular_file(parent, parts[-1]) if self.keep_owners
                         else None) or self.owner
                if owner is not None:
                    os.fchown(fd, *owner)
                os.fchmod(fd, member.mode & 0o777)
                _set_mtime(fd, member.mtime)
            finally:
                os.close(fd)
            os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            _unlink(parent, tmp)
            raise
        self.counts["files"] += 1
        self.counts["bytes"] += member.size

    def _symlink(self, parts: List[str], member: tarfile.TarInfo) -> None:
        target = member.linkname
        if not target or "\x00" in target:
            raise _Skip("a symlink with an empty or invalid target")
        if not self.outside_links and _escapes(parts, target):
            raise _Skip(f"a symlink to {shown(target)}, outside the directory")
        parent = self._parent(parts[:-1])
        self._not_a_dir_there(parent, parts[-1])
        tmp = f".abx-{os.urandom(6).hex()}.part"
        os.symlink(target, tmp, dir_fd=parent)
        try:
            if self.owner is not None:
                owners.give_link(parent, tmp, self.owner)
            os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            _unlink(parent, tmp)
            raise
        self.counts["symlinks"] += 1


def _is_link(parent: int, name: str) -> bool:
    import stat

    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _set_mtime(fd: int, mtime: Any) -> None:
    try:
        os.utime(fd, (float(mtime), float(mtime)))
    except (OSError, ValueError, OverflowError, TypeError):
        pass  # an impossible time from the archive: the file keeps "now"


def _unlink(parent: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=parent)
    except OSError:
        pass
