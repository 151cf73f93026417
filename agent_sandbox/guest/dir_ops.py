"""The guest's directory transfers (stdlib only): ``tar_out`` streams a directory as a tar
archive (``files.download_dir``), ``tar_in`` extracts one into a directory
(``files.upload_dir``), confined to it (see ``dir_unpack``); what it makes belongs to
``user`` (default root), a file it replaces keeps its owner."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict

    Req = Dict[str, Any]

if __package__:
    from . import checks, dir_pack, file_ops, ops
    from . import protocol as proto
    from .conn import Conn
    from .errors import bad, os_error
    from .limits import STREAM_TIMEOUT
else:  # imported by agent.py from the guest's directory
    import checks  # type: ignore[no-redef]
    import dir_pack  # type: ignore[no-redef]
    import file_ops  # type: ignore[no-redef]
    import ops  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import bad, os_error  # type: ignore[no-redef]
    from limits import STREAM_TIMEOUT  # type: ignore[no-redef]


def _unpack_module() -> Any:
    """``dir_unpack`` imports ``tarfile`` (milliseconds): not at the guest's startup."""
    if __package__:
        from . import dir_unpack
    else:
        import dir_unpack  # type: ignore[no-redef]
    return dir_unpack


def _open_dir(path: str) -> int:
    """The directory ``path`` (a symlink is followed for it alone, as ``list`` does)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except NotADirectoryError:
        raise bad(f"{path}: not a directory") from None
    except OSError as exc:
        raise os_error(exc, path) from None


def op_tar_out(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    fd = _open_dir(path)
    sent = 0
    try:
        notes = dir_pack.Notes()
        for piece in dir_pack.pack(fd, notes, one_fs=True):  # no /proc, /sys, /dev
            for start in range(0, len(piece), proto.CHUNK):
                conn.send({"chunk": True}, piece[start:start + proto.CHUNK])
            sent += len(piece)
    finally:
        os.close(fd)
    conn.done(size=sent)


def op_tar_in(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    account = file_ops.owner_of(req)  # what is made is theirs (None: root's)
    owner = (account.uid, account.gid) if account is not None else None
    if os.path.lexists(path) and not os.path.isdir(path):
        raise bad(f"{path}: exists and is not a directory")
    try:
        file_ops.make_dirs(path, 0o755, account)
    except OSError as exc:
        raise os_error(exc, path) from None
    fd = _open_dir(path)
    try:
        conn.send({"ready": True})
        conn.sock.settimeout(STREAM_TIMEOUT)
        ended = [False]

        def pull() -> bytes:
            while not ended[0]:
                obj, payload = conn.recv("archive data")
                if obj.get("eof"):
                    ended[0] = True
                if payload:
                    return payload
            return b""

        # A replaced file keeps its owner, as files.write's does.
        unpacker = _unpack_module().Unpacker(fd, dir_pack.Notes(), outside_links=True,
                                             owner=owner, keep_owners=True)
        try:
            summary = unpacker.run(pull)
        except dir_pack.ArchiveError as exc:
            raise bad(f"{path}: {exc.message}") from None
        except OSError as exc:
            raise os_error(exc, path) from None
    finally:
        os.close(fd)
    conn.done(**summary)


HANDLERS: Dict[str, Callable[[Conn, Req], None]] = {
    ops.TAR_OUT: op_tar_out,
    ops.TAR_IN: op_tar_in,
}
