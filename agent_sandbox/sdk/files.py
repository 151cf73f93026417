"""``sandbox.files``: the sandbox's filesystem, as seen from inside it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Literal, overload

from agent_sandbox.errors import InvalidArgumentError
from agent_sandbox.models import EntryInfo
from agent_sandbox.providers.base import Provider


class Files:
    def __init__(self, provider: Provider, sandbox_id: str) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id

    @overload
    def read(self, path: str, format: Literal["text"] = ...) -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["stream"]) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text") -> str | bytes | Iterator[bytes]:
        """Read a file: ``text`` (UTF-8), ``bytes``, or ``stream`` (chunks, any size)."""
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgumentError(f"format must be 'text', 'bytes' or 'stream', "
                                       f"got {format!r}")
        chunks = self._provider.read_file(self._sandbox_id, path)
        if format == "stream":
            return chunks
        data = b"".join(chunks)
        if format == "bytes":
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(
                f"{path} is not UTF-8 text (byte {exc.start}); read it with format='bytes'"
            ) from None

    def write(self, path: str, data: str | bytes | Iterable[bytes] | IO[bytes],
              mode: int = 0o644) -> int:
        """Write (create or replace) a file, making parent directories; returns its size.

        ``data`` may be a file object or an iterable of chunks: it is streamed.
        """
        return self._provider.write_file(self._sandbox_id, path, data, mode=mode)

    def list(self, path: str = "/workspace", depth: int = 1) -> list[EntryInfo]:
        return self._provider.list_files(self._sandbox_id, path, depth=depth)

    def exists(self, path: str) -> bool:
        return self._provider.exists(self._sandbox_id, path)

    def stat(self, path: str) -> EntryInfo:
        return self._provider.stat(self._sandbox_id, path)

    def make_dir(self, path: str) -> None:
        self._provider.make_dir(self._sandbox_id, path)

    def remove(self, path: str) -> None:
        self._provider.remove(self._sandbox_id, path)

    def rename(self, src: str, dst: str) -> None:
        self._provider.rename(self._sandbox_id, src, dst)
