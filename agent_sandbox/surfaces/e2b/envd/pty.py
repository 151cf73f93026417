"""envd's terminals (``Start`` with ``pty``) on the provider's ``pty_open``: the Start
stream holds one attachment (its output, as ``pty`` data events); input and resizes go
through it while it lasts, through a short attachment of their own otherwise (the
terminal keeps running when its client goes, as in envd)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.pty import PtySession
from agent_sandbox.surfaces.e2b import target
from agent_sandbox.surfaces.e2b.envd import proc_events as ev
from agent_sandbox.surfaces.e2b.envd.errors import connect_error, unexpected
from agent_sandbox.surfaces.e2b.envd.registry import Record
from agent_sandbox.surfaces.e2b.envd_pb.process import process_pb as pb
from agent_sandbox.surfaces.http.streaming import WorkFn

DEFAULT_SIZE = (80, 24)


def start_work(found: target.Target, record: Record, size: pb.PTY.Size | None,
               cmd: str) -> WorkFn:
    """A new terminal running ``cmd``; its attachment is kept in ``record``."""
    cols, rows = (size.cols, size.rows) if size is not None else DEFAULT_SIZE

    def open_session(on_data: Callable[[bytes], None]) -> PtySession:
        return found.provider.pty_open(found.sandbox_id, cols=cols, rows=rows, cwd=record.cwd,
                                       envs=record.envs, cmd=cmd, on_data=on_data,
                                       user=record.user)

    def opened(session: PtySession) -> None:
        record.session = session

    return ev.pty_work(open_session, opened)


def attach_work(found: target.Target, pid: int) -> WorkFn:
    """The running terminal ``pid`` (its recent output first)."""
    return ev.pty_work(
        lambda on_data: found.provider.pty_open(found.sandbox_id, pid, on_data=on_data),
        lambda session: None)


async def call(found: target.Target, pid: int, record: Record | None,
               action: Callable[[PtySession], Any], what: str) -> None:
    """``action`` on the terminal: through its Start stream's attachment, or one made for
    it (and detached after)."""
    def run() -> None:
        session = record.session if record is not None else None
        if session is not None and not session.ended:
            action(session)
            return
        session = found.provider.pty_open(found.sandbox_id, pid)
        try:
            action(session)
        finally:
            session.close()

    try:
        await anyio.to_thread.run_sync(run)
    except SandboxError as exc:
        raise connect_error(exc) from None
    except Exception as exc:  # noqa: BLE001 - INTERNAL for the client, not a traceback
        raise unexpected(exc, what) from None
