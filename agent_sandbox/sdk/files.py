"""``sandbox.files``: the sandbox's filesystem, as seen from inside it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import IO, Literal, overload

from agent_sandbox.errors import InvalidArgumentError
from agent_sandbox.models import DirTransfer, EntryInfo, FilesystemEvent
from agent_sandbox.providers.base import Provider
from agent_sandbox.sdk import dirs
from agent_sandbox.sdk.watch import WatchHandle

DEFAULT_READ_MAX = 100 << 20  # bytes read into memory by read(); stream for more


class Files:
    def __init__(self, provider: Provider, sandbox_id: str) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id

    @overload
    def read(self, path: str, format: Literal["text"] = ...,
             max_bytes: int = ...) -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"], max_bytes: int = ...) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["stream"],
             max_bytes: int = ...) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text",
             max_bytes: int = DEFAULT_READ_MAX) -> str | bytes | Iterator[bytes]:
        """Read a file: ``text`` (UTF-8) or ``bytes``, at most ``max_bytes`` of it (a
        larger file is an error, never a grown caller: a sandbox can make any file
        endless), or ``stream`` (chunks, any size, read as far as the caller wants)."""
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgumentError(f"format must be 'text', 'bytes' or 'stream', "
                                       f"got {format!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidArgumentError(f"max_bytes must be a whole number >= 0, got {max_bytes!r}")
        if format == "stream":
            return self._provider.read_file(self._sandbox_id, path)
        chunks = self._provider.read_file(self._sandbox_id, path, limit=max_bytes + 1)
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
            return bytes(data)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(
                f"{path} is not UTF-8 text (byte {exc.start}); read it with format='bytes'"
            ) from None

    def write(self, path: str, data: str | bytes | Iterable[bytes] | IO[bytes],
              mode: int = 0o644, user: str | None = None) -> int:
        """Write (create or replace) a file, making parent directories; returns its size.

        ``data`` may be a file object or an iterable of chunks: it is streamed. A new file
        and the directories made for it belong to ``user`` (default root), so a command
        run as that user can change them; a replaced file keeps its owner.
        """
        return self._provider.write_file(self._sandbox_id, path, data, mode=mode, user=user)

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

    def upload_dir(self, local_dir: dirs.LocalPath, remote_dir: str) -> DirTransfer:
        """Copy the contents of a local directory into ``remote_dir`` (made, with its
        parents, if missing; files there are replaced), streamed as a tar archive.

        Files, directories and symlinks are copied (symlinks as links, never followed);
        permission bits without setuid/setgid/sticky; hard links become copies. Sockets,
        fifos and devices are skipped, and so is a member that would go through a
        symlink already in ``remote_dir``: each is listed in ``skipped`` with the reason.
        """
        return dirs.upload_dir(self._provider, self._sandbox_id, local_dir, remote_dir)

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
