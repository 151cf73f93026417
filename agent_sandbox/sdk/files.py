"""``sandbox.files``: the sandbox's filesystem, as seen from inside it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import IO, Literal, overload

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.models import DirTransfer, EntryInfo, FileLock, FilesystemEvent
from agent_sandbox.core.provider import Provider
from agent_sandbox.sdk import dirs
from agent_sandbox.sdk.watch import WatchHandle

DEFAULT_READ_MAX = 100 << 20  # bytes read into memory by read(); stream for more


def _check_read(format: str, max_bytes: int, offset: int, formats: tuple[str, ...]) -> None:
    if format not in formats:
        raise InvalidArgumentError(f"format must be {' or '.join(map(repr, formats))}, "
                                   f"got {format!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise InvalidArgumentError(f"max_bytes must be a whole number >= 0, got {max_bytes!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= 1 << 62:
        raise InvalidArgumentError(f"offset must be a whole number from 0 to 2**62, got "
                                   f"{offset!r}")


class Files:
    def __init__(self, provider: Provider, sandbox_id: str) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id

    @overload
    def read(self, path: str, format: Literal["text"] = ...,
             max_bytes: int = ..., offset: int = ...) -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"], max_bytes: int = ...,
             offset: int = ...) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["stream"],
             max_bytes: int = ..., offset: int = ...) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text",
             max_bytes: int = DEFAULT_READ_MAX, offset: int = 0) -> str | bytes | Iterator[bytes]:
        """Read a file: ``text`` (UTF-8) or ``bytes``, at most ``max_bytes`` of it (a
        larger file is an error, never a grown caller: a sandbox can make any file
        endless), or ``stream`` (chunks, any size, read as far as the caller wants).
        ``offset``: from that byte on (0 to 2**62; past the end: nothing)."""
        _check_read(format, max_bytes, offset, ("text", "bytes", "stream"))
        if format == "stream":  # its .version: the version the file was read at
            return self._provider.read_file(self._sandbox_id, path, offset=offset)
        return self._read_whole(path, format, max_bytes, offset)[0]

    def read_with_version(self, path: str, format: Literal["text", "bytes"] = "text",
                          max_bytes: int = DEFAULT_READ_MAX, offset: int = 0
                          ) -> tuple[str | bytes, str | None]:
        """``read``, and the version the file was read at: pass it to ``write(...,
        if_match=version)`` to write only if nobody wrote the file since (else
        ``ConflictError``: read again and redo the change)."""
        _check_read(format, max_bytes, offset, ("text", "bytes"))
        return self._read_whole(path, format, max_bytes, offset)

    def _read_whole(self, path: str, format: str, max_bytes: int,
                    offset: int) -> tuple[str | bytes, str | None]:
        chunks = self._provider.read_file(self._sandbox_id, path, offset=offset,
                                          limit=max_bytes + 1)
        version = getattr(chunks, "version", None)
        data = bytearray()
        try:
            for chunk in chunks:
                data += chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if len(data) > max_bytes:
            raise InvalidArgumentError(
                f"{path} is larger than max_bytes={max_bytes}; pass a larger max_bytes or "
                "read it with format='stream'")
        if format == "bytes":
            return bytes(data), version
        try:
            return data.decode("utf-8"), version
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(
                f"{path} is not UTF-8 text (byte {exc.start}); read it with format='bytes'"
            ) from None

    def write(self, path: str, data: str | bytes | Iterable[bytes] | IO[bytes],
              mode: int = 0o644, user: str | None = None, *, if_match: str | None = None,
              lock_wait: float | None = None, lock: str | FileLock | None = None,
              metadata: dict[str, str] | None = None) -> int:
        """Write (create or replace) a file, making parent directories; returns its size.

        ``data`` may be a file object or an iterable of chunks: it is streamed. A new file
        and the directories made for it belong to ``user`` (default root), so a command
        run as that user can change them; a replaced file keeps its owner.

        Writes of one file are taken in turn (from every client of the sandbox): this one
        waits at most ``lock_wait`` seconds (default 3) for another write, or another
        holder's ``lock``, to end, else ``LockedError`` (its ``retry_after``, and for a
        lock the holder and time left, are in ``details``). ``if_match``: write only if
        the file is still at that version (``read_with_version``, ``stat().version``),
        else ``ConflictError``. ``lock``: your own lock on the file (``files.lock``).
        ``metadata``: the file's own key/value pairs (kept as its ``user.e2b.*`` xattrs, as
        E2B's; ``stat`` and listings give them back), replacing any it had.
        """
        token = lock.token if isinstance(lock, FileLock) else lock
        return self._provider.write_file(self._sandbox_id, path, data, mode=mode, user=user,
                                         if_match=if_match, lock_wait=lock_wait,
                                         lock_token=token, metadata=metadata)

    def lock(self, path: str, ttl: float = 60.0, *, wait: float | None = None,
             holder: str | None = None, renew: str | FileLock | None = None) -> FileLock:
        """Lock a file for an edit of several steps: until ``unlock``, or ``ttl`` seconds
        (renew it with ``renew=`` the lock), writes without it get ``LockedError``.
        ``wait``: seconds to wait for another's lock or write to end (default 0). The lock
        binds this package's writers (every client of the sandbox), not the sandbox's own
        processes."""
        token = renew.token if isinstance(renew, FileLock) else renew
        return self._provider.lock_file(self._sandbox_id, path, ttl, holder=holder,
                                        wait=wait, token=token)

    def unlock(self, lock: FileLock | str, path: str | None = None) -> None:
        """Release a lock (a ``FileLock``, or a token with its ``path``)."""
        if isinstance(lock, FileLock):
            lock, path = lock.token, lock.path
        if path is None:
            raise InvalidArgumentError("unlock needs the FileLock, or the token and its path")
        self._provider.unlock_file(self._sandbox_id, path, lock)

    def unlock_all(self, holder: str) -> int:
        """Release every lock ``holder`` (the name given to ``lock``) has in this sandbox
        (a client's session ended); returns how many."""
        return self._provider.release_locks(self._sandbox_id, holder)

    def list(self, path: str = "/workspace", depth: int = 1) -> list[EntryInfo]:
        return self._provider.list_files(self._sandbox_id, path, depth=depth)

    def exists(self, path: str) -> bool:
        return self._provider.exists(self._sandbox_id, path)

    def stat(self, path: str) -> EntryInfo:
        return self._provider.stat(self._sandbox_id, path)

    def make_dir(self, path: str, user: str | None = None) -> None:
        """Make a directory and its parents; those made belong to ``user`` (default root)."""
        self._provider.make_dir(self._sandbox_id, path, user=user)

    def remove(self, path: str) -> None:
        self._provider.remove(self._sandbox_id, path)

    def rename(self, src: str, dst: str) -> None:
        self._provider.rename(self._sandbox_id, src, dst)

    def watch_dir(self, path: str, recursive: bool = False,
                  on_event: Callable[[FilesystemEvent], None] | None = None,
                  timeout: float | None = None) -> WatchHandle:
        """Watch a directory for changes: ``create``, ``modify``, ``chmod``, ``delete``
        and ``rename`` events (a rename has ``old_path``; a move out of the directory is a
        delete, into it a create), and ``overflow`` when events were lost. Returns once
        the sandbox watches it: a change made after that is seen. ``recursive`` watches
        subdirectories too, as they appear (up to 4096 directories). ``timeout`` ends the
        watch after that many seconds (None: when ``stop()`` is called). A watch does not
        count as use of the sandbox (it may still be paused when idle)."""
        stream = self._provider.watch_dir(self._sandbox_id, path, recursive=recursive,
                                          timeout=timeout)
        return WatchHandle(stream, on_event)

    def upload_dir(self, local_dir: dirs.LocalPath, remote_dir: str,
                   user: str | None = None) -> DirTransfer:
        """Copy the contents of a local directory into ``remote_dir`` (made, with its
        parents, if missing; files there are replaced), streamed as a tar archive.

        What it makes belongs to ``user`` (default root, as with ``write``), so a command
        run as that user can change it; a replaced file keeps its owner.

        Files, directories and symlinks are copied (symlinks as links, never followed);
        permission bits without setuid/setgid/sticky; hard links become copies. Sockets,
        fifos and devices are skipped, and so is a member that would go through a
        symlink already in ``remote_dir``: each is listed in ``skipped`` with the reason.
        """
        return dirs.upload_dir(self._provider, self._sandbox_id, local_dir, remote_dir,
                               user=user)

    def download_dir(self, remote_dir: str, local_dir: dirs.LocalPath, *,
                     max_bytes: int | None = dirs.DEFAULT_MAX_BYTES,
                     max_entries: int | None = dirs.DEFAULT_MAX_ENTRIES,
                     outside_links: bool = False) -> DirTransfer:
        """Copy the contents of ``remote_dir`` into a local directory (made, with its
        parents, if missing; files there are replaced), streamed as a tar archive.

        What the sandbox sends is not trusted: nothing is written outside ``local_dir``
        (no absolute or ``..`` names, nothing through a symlink, no setuid bits or
        owners). Symlinks are kept as links; those pointing out of the tree (absolute,
        or up past its top) are skipped unless ``outside_links=True``. The transfer
        stops with an error past ``max_bytes`` archive bytes or ``max_entries`` entries
        (None: no limit). ``skipped`` lists what was left out, and why.
        """
        return dirs.download_dir(self._provider, self._sandbox_id, remote_dir, local_dir,
                                 max_bytes=max_bytes, max_entries=max_entries,
                                 outside_links=outside_links)
