"""The engine's terminals: ``pty_open`` starts a program on a pseudo-terminal in a sandbox
(a login shell unless told otherwise) or attaches to one by pid."""

from __future__ import annotations

import contextlib
from typing import Any

from agent_sandbox.core import validate
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.pty import DataCallback, PtySession, check_size
from agent_sandbox.guest import ops
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.guestlink.pty import open_pty, pty_kill
from agent_sandbox.service.access import GuestAccess

DEFAULT_TERM = "xterm-256color"


class Terminals(GuestAccess):

    def pty_open(self, sandbox_id: str, pid: int | None = None, *, cols: int = 80,
                 rows: int = 24, cwd: str | None = None, envs: dict[str, str] | None = None,
                 cmd: str | None = None, on_data: DataCallback | None = None,
                 user: str | None = None) -> PtySession:
        """A new terminal running ``cmd`` (through ``sh -c``; default: a login shell) of
        ``cols`` x ``rows`` in ``cwd`` (default: the template's workdir), or with ``pid``
        the running terminal of that pid (its recent output first; the other arguments
        then do not apply). ``user`` runs it as that account of the sandbox (e.g. "user",
        uid 1000; default root). Output goes to ``on_data`` as bytes; the sandbox counts
        as busy (no idle pause) while a client is attached."""
        row = self.row(sandbox_id)
        req: dict[str, Any]
        if pid is None:
            cols, rows = check_size(cols, rows)
            argv = None if cmd is None else ["/bin/sh", "-c", validate.command(cmd)]
            cwd = validate.path(cwd or self.template_for(row).workdir, "cwd")
            env = self.env(row, {"TERM": DEFAULT_TERM, **validate.envs(envs)})
            req = {"op": ops.PTY_CREATE, "argv": argv, "cwd": cwd, "env": env, "cols": cols,
                   "rows": rows, "user": validate.user(user)}
        else:
            pid = validate.positive(pid, "pid", allow_none=False, integer=True)
            req = {"op": ops.PTY_ATTACH, "pid": pid}

        def start(guest: GuestClient) -> PtySession:
            return open_pty(guest, req, on_data,
                            lambda pid, sig: self.pty_kill(sandbox_id, pid, sig))

        busy = contextlib.ExitStack()  # attached: the idle timer waits
        busy.enter_context(self.activity.busy(sandbox_id))
        try:
            session: PtySession = self.call(sandbox_id, start, row)
        except BaseException:
            busy.close()
            raise
        session.on_end(busy.close)
        return session

    def pty_kill(self, sandbox_id: str, pid: int, sig: int = 9) -> bool:
        """Signal a terminal's program (and its foreground job); False if it had ended."""
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        if isinstance(sig, bool) or not isinstance(sig, int) or not 1 <= sig <= 64:
            raise InvalidArgumentError(f"signal must be a number from 1 to 64, got {sig!r}")
        return bool(self.call(sandbox_id, lambda g: pty_kill(g, pid, sig)))
