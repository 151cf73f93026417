"""``abx sandbox shell``: an interactive terminal in a sandbox.

The local terminal goes to raw mode (restored on every way out), so every key, Ctrl-C
and Ctrl-D included, is typed inside the sandbox, not read by abx; a resize of the local
window (SIGWINCH) resizes the remote terminal; abx exits with the program's exit status.
If abx itself is hung up or terminated, the program inside is killed, as a shell's
session is when its ssh connection drops.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from agent_sandbox.surfaces.cli.output import CliError
from agent_sandbox.surfaces.cli.sdkutil import connect, parse_pairs

_PASSED_ENV = ("TERM", "COLORTERM")  # what the local terminal is, for programs inside


class _Hangup(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
        except OSError:
            return  # our terminal is gone; the main loop notices it on stdin


def terminal_size(fd: int) -> tuple[int, int]:
    """The local terminal's size; a dimension it does not know (0, as a pty nobody sized
    reports) is the classic 80x24, not a 1-column terminal."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return size.columns or 80, size.lines or 24


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The terminal in raw mode: keys reach us one by one, none becomes a signal."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _signals(wake: int) -> Iterator[None]:
    """SIGWINCH wakes the loop; SIGHUP and SIGTERM end it (restoring the terminal)."""

    def hangup(signum: int, frame: Any) -> None:
        raise _Hangup(signum)

    handlers = {signal.SIGWINCH: lambda *_: _poke(wake, b"w"),
                signal.SIGHUP: hangup, signal.SIGTERM: hangup}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _poke(fd: int, what: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, what)


def _pump_keys(handle: Any, stdin: int, wake: int) -> bool:
    """Keys to the terminal until the program ends (True) or stdin closes (False)."""
    while True:
        ready, _, _ = select.select([stdin, wake], [], [])
        if wake in ready:
            events = os.read(wake, 512)
            if b"e" in events:
                return True
            if b"w" in events:
                with contextlib.suppress(Exception):  # ended meanwhile: the next wake says
                    handle.resize(*terminal_size(stdin))
        if stdin in ready:
            data = os.read(stdin, 65536)
            if not data:
                return False
            try:
                handle.send_input(data)
            except Exception:  # noqa: BLE001 - it ended: the waiter wakes us with why
                if handle.exit_code is not None:
                    return True


def shell(
    sandbox_id: Annotated[str, typer.Argument(help="Sandbox id (see `abx sandbox list`).")],
    cmd: Annotated[str | None, typer.Option("--cmd", help="Run this command line on the "
                                            "terminal instead of a login shell.")] = None,
    cwd: Annotated[str | None, typer.Option(help="Working directory inside.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE, "
                                                  "repeatable.")] = None,
) -> None:
    """Open an interactive terminal in a sandbox (a login shell unless --cmd): Ctrl-C and
    Ctrl-D go to the program inside; abx exits with its exit status."""
    stdin = sys.stdin.fileno() if sys.stdin is not None else -1
    if stdin < 0 or not os.isatty(stdin):
        raise CliError("abx sandbox shell needs an interactive terminal, and its input is "
                       "not one; to run a command with piped input or from a script use "
                       f"`abx sandbox exec {sandbox_id} -- COMMAND`", 2)
    envs = {name: os.environ[name] for name in _PASSED_ENV if os.environ.get(name)}
    envs.update(parse_pairs(env, "--env") or {})
    sb = connect(sandbox_id)
    out = sys.stdout.fileno()
    wake_r, wake_w = os.pipe()
    cols, rows = terminal_size(stdin)
    handle = None
    try:
        with _signals(wake_w), _raw(stdin):
            handle = sb.pty.create(cols=cols, rows=rows, cwd=cwd, envs=envs, cmd=cmd,
                                   on_data=lambda data: _write_all(out, data))

            def waiter() -> None:
                with contextlib.suppress(Exception):
                    handle.wait()
                _poke(wake_w, b"e")

            threading.Thread(target=waiter, name="abx-shell-wait", daemon=True).start()
            ended = _pump_keys(handle, stdin, wake_r)
        if not ended:  # our terminal closed under us: nobody is left to type
            raise _Hangup(signal.SIGHUP)
        code = handle.wait()
    except (_Hangup, KeyboardInterrupt) as exc:
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.kill()
        signum = exc.signum if isinstance(exc, _Hangup) else signal.SIGINT
        raise typer.Exit(128 + signum) from None
    # The wake pipe stays open: the waiter thread may still poke it as abx exits.
    raise typer.Exit(code)
