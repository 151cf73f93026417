"""Directory transfers of the engine: a sandbox directory as a tar stream out, a tar stream
extracted into one, both carried out by the guest (``guest/dir_ops.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Any

from agent_sandbox.core import validate
from agent_sandbox.core.models import DirTransfer
from agent_sandbox.guest.dir_pack import MAX_NOTE, MAX_NOTES
from agent_sandbox.guestlink.client import GuestClient, GuestProtocolError, field
from agent_sandbox.service.access import GuestAccess


def transfer_summary(raw: dict[str, Any]) -> DirTransfer:
    """The guest's summary of an extraction, checked: counts are whole numbers, the notes
    a short list of short strings."""
    counts = {key: field(raw, key, int, 0) for key in ("files", "dirs", "symlinks", "bytes")}
    notes = field(raw, "skipped", list, [])
    if len(notes) > MAX_NOTES + 1 or not all(isinstance(n, str) for n in notes):
        raise GuestProtocolError("the guest sent an invalid list of skipped entries")
    return DirTransfer(files=counts["files"], dirs=counts["dirs"], symlinks=counts["symlinks"],
                       size=counts["bytes"], skipped=[n[:MAX_NOTE] for n in notes])


class DirOps(GuestAccess):
    """Directories in and out as tar streams."""


    def read_dir_archive(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        """The directory ``path`` in the sandbox as tar chunks (members relative to it).
        Errors (missing, not a directory) are raised here; the chunks come from the sandbox
        and are hostile (``files.download_dir`` extracts them with ``dir_unpack``)."""
        path = validate.path(path)
        return self.stream(sandbox_id, lambda g: g.read_tar(path))

    def write_dir_archive(self, sandbox_id: str, path: str,
                          data: Iterable[bytes] | IO[bytes],
                          user: str | None = None) -> DirTransfer:
        """Extract a tar stream into the directory ``path`` in the sandbox (made with its
        parents if missing), confined to it; what it makes belongs to ``user`` (None:
        root), a file it replaces keeps its owner."""
        path = validate.path(path)
        user = validate.user(user)

        def extract(guest: GuestClient) -> dict[str, Any]:
            return guest.write_tar(path, data, user=user)

        return transfer_summary(self.call(sandbox_id, extract))
