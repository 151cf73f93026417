"""``sandbox.pty``: interactive terminals (a real pseudo-terminal in the sandbox: job
control, Ctrl-C, full-screen programs), several at once, that outlive the client."""

from __future__ import annotations

from collections.abc import Callable

from agent_sandbox.core.provider import Provider
from agent_sandbox.core.pty import PtySession

DataCallback = Callable[[bytes], None]


class PtyHandle:
    """A terminal this client is attached to. Its output goes to ``on_data`` (bytes, from a
    background thread) as it comes. ``disconnect()`` detaches and leaves it running."""

    def __init__(self, session: PtySession) -> None:
        self._session = session
        self.pid = session.pid

    @property
    def exit_code(self) -> int | None:
        """The program's exit code once it has ended (128+N: killed by signal N)."""
        return self._session.exit_code

    def send_input(self, data: bytes | str) -> None:
        """Type into the terminal: ``"ls\\n"``, ``b"\\x03"`` (Ctrl-C), ``b"\\x04"`` (Ctrl-D)."""
        self._session.send_input(data)

    def resize(self, cols: int, rows: int) -> None:
        """Resize the terminal; the program in the foreground gets SIGWINCH."""
        self._session.resize(cols, rows)

    def kill(self) -> bool:
        """Kill the program (SIGKILL to it and its foreground job); False if it had ended."""
        return self._session.kill(9)

    def wait(self, timeout: float | None = None) -> int:
        """Block until the program ends and return its exit code (raises
        SandboxTimeoutError after ``timeout`` seconds; the terminal keeps running)."""
        return self._session.wait(timeout)

    def disconnect(self) -> None:
        """Stop receiving output; the terminal keeps running (``pty.connect(pid)``)."""
        self._session.close()

    def __repr__(self) -> str:
        return f"PtyHandle(pid={self.pid})"


class Pty:
    def __init__(self, provider: Provider, sandbox_id: str) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id

    def create(self, cols: int = 80, rows: int = 24, cwd: str | None = None,
               envs: dict[str, str] | None = None, on_data: DataCallback | None = None,
               cmd: str | None = None, user: str | None = None) -> PtyHandle:
        """Start ``cmd`` (a shell command line; default: a login shell) on a new terminal
        of ``cols`` x ``rows`` in ``cwd`` (default: the template's workdir). ``TERM`` is
        ``xterm-256color`` unless ``envs`` says otherwise. ``user="user"`` runs it as the
        sandbox's unprivileged account (uid 1000, HOME /home/user)."""
        return PtyHandle(self._provider.pty_open(self._sandbox_id, cols=cols, rows=rows,
                                                 cwd=cwd, envs=envs, cmd=cmd,
                                                 on_data=on_data, user=user))

    def connect(self, pid: int, on_data: DataCallback | None = None) -> PtyHandle:
        """Attach to a running terminal (started by any client): its recent output (up to
        256 KiB) comes first, then what it prints from now on."""
        return PtyHandle(self._provider.pty_open(self._sandbox_id, pid, on_data=on_data))

    def kill(self, pid: int) -> bool:
        """Kill a terminal's program without attaching; False if it had ended."""
        return self._provider.pty_kill(self._sandbox_id, pid)
