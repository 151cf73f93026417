"""``abx sandbox shell`` driven as a person would: in a real terminal (a pseudo-terminal of
the test's own, abx on it as its controlling tty), through every engine the CLI can use:
this host's engine as root, a gateway, the daemon (as a local user in group abx) and the
rootless engine (as a local user). Full-screen output, a resize seen inside, Ctrl-C
stopping a ``sleep`` inside (not abx), Ctrl-D, the exit status coming back and the local
terminal's modes restored."""

from __future__ import annotations

import fcntl
import grp
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ptyscreen import Screen

pytestmark = pytest.mark.integration
PROMPT = r"[#$] $"
ABX = Path(sys.executable).parent / "abx"  # as tests/cli/conftest.py finds it


def _abx() -> list[str]:
    return [str(ABX)] if ABX.exists() else [sys.executable, "-m", "agent_sandbox.surfaces.cli"]


def _base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ABX_SANDBOX_") and k not in ("ABX_ENGINE", "TERM")}
    env.update(TERM="xterm-256color", **extra)
    return env


def _make_ctty() -> None:  # in the child, after setsid
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A program on a pseudo-terminal: keys in, what it shows out, window resizes."""

    def __init__(self, argv: list[str], env: dict[str, str], cols: int = 80,
                 rows: int = 24) -> None:
        self.master, self.slave = os.openpty()
        self.resize(cols, rows)
        self.modes = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(argv, stdin=self.slave, stdout=self.slave,
                                     stderr=self.slave, env=env, start_new_session=True,
                                     preexec_fn=_make_ctty, cwd="/")
        self.screen = Screen()
        self._stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                if data:
                    self.screen(data)

    def type(self, keys: str | bytes) -> None:
        os.write(self.master, keys.encode() if isinstance(keys, str) else keys)

    def resize(self, cols: int, rows: int) -> None:
        # As a terminal emulator does: the kernel then sends SIGWINCH to the foreground job.
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            shown = self.screen.text()[-800:]
            raise AssertionError(f"abx still running; it shows: {shown!r}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._stop.set()
        time.sleep(0.3)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminals() -> Iterator[Any]:
    made: list[Terminal] = []

    def start(argv: list[str], env: dict[str, str], **kw: int) -> Terminal:
        made.append(Terminal(argv, env, **kw))
        return made[-1]

    yield start
    for term in made:
        term.close()


def _full_screen(term: Terminal) -> None:
    """vi where the template has it (the base template shares the host's /usr), else the
    same escape sequences through tput."""
    s = term.screen
    term.type("if command -v vi >/dev/null; then echo vi-$((6*7)); else echo no-$((6*7)); fi\r")
    if s.expect(r"(vi|no)-42").group(1) == b"vi":
        term.type("vi /tmp/abx-shell-test\r")
        s.expect(r"\x1b\[\?1049h")  # the alternate screen, as full-screen programs use
        s.expect(r"~")
        term.type(b"\x1b:q!\r")
        s.expect(r"\x1b\[\?1049l")
    else:
        term.type("tput smcup; tput cup 9 19; echo HERE; tput rmcup\r")
        s.expect(r"\x1b\[\?1049h")
        s.expect(r"\x1b\[10;20HHERE")
        s.expect(r"\x1b\[\?1049l")
    s.expect(PROMPT)


def drive(term: Terminal) -> None:
    """The session a person would have; abx must exit with the shell's status (7)."""
    s = term.screen
    s.expect(PROMPT, timeout=120)
    term.type("stty size; tty\r")
    s.expect(r"24 80\r\n/dev/pts/\d+\r\n")
    term.resize(100, 30)
    time.sleep(0.5)
    term.type("stty size\r")
    s.expect(r"30 100\r\n")
    _full_screen(term)
    term.type("sleep 30\r")
    time.sleep(1)
    started = time.monotonic()
    term.type(b"\x03")  # Ctrl-C: stops the sleep inside, abx goes on
    term.type("echo rc=$?\r")
    s.expect(r"rc=130\r\n")
    assert time.monotonic() - started < 10
    assert term.proc.poll() is None
    term.type("exit 7\r")
    assert term.wait() == 7
    assert termios.tcgetattr(term.slave) == term.modes, "the local terminal was not restored"


def ctrl_d(term: Terminal) -> None:
    term.screen.expect(PROMPT, timeout=120)
    term.type(b"\x04")  # Ctrl-D: end of input for the shell inside, not for abx
    assert term.wait() == 0
    assert termios.tcgetattr(term.slave) == term.modes


def _sandbox(argv_prefix: list[str], env: dict[str, str], run: Any = subprocess.run) -> str:
    proc = run([*argv_prefix, "sandbox", "create", "--json"], env=env, capture_output=True,
               text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["sandbox_id"]


def _kill(argv_prefix: list[str], env: dict[str, str], sandbox_id: str) -> None:
    subprocess.run([*argv_prefix, "sandbox", "kill", sandbox_id, "--delete-volume"], env=env,
                   capture_output=True, timeout=120)


def test_shell_on_this_hosts_engine(terminals: Any) -> None:
    env = _base_env()
    sid = _sandbox(_abx(), env)
    try:
        drive(terminals([*_abx(), "sandbox", "shell", sid], env))
        ctrl_d(terminals([*_abx(), "sandbox", "shell", sid], env))
        term = terminals([*_abx(), "sandbox", "shell", sid, "--cmd", "tput cols; exit 3"], env,
                         cols=91)
        term.screen.expect(r"91\r\n")
        assert term.wait() == 3
    finally:
        _kill(_abx(), env, sid)


def test_shell_through_a_gateway(terminals: Any) -> None:
    from agent_sandbox.surfaces.gateway.process import GatewayProcess
    from agent_sandbox.surfaces.http.keys import KeyStore

    keys_file = str(Path(tempfile.mkdtemp(prefix="abx-shell-keys-")) / "keys.db")
    _, token = KeyStore(keys_file).create("shell-test")
    gateway = GatewayProcess(keys_file=keys_file).start()
    env = _base_env(ABX_SANDBOX_BASE_URL=gateway.url, ABX_SANDBOX_API_KEY=token)
    try:
        sid = _sandbox(_abx(), env)
        try:
            drive(terminals([*_abx(), "sandbox", "shell", sid], env))
            # abx hung up (its terminal closed): the shell inside is killed, not left behind.
            term = terminals([*_abx(), "sandbox", "shell", sid], env)
            term.screen.expect(PROMPT, timeout=120)
            term.type("echo pid=$$\r")
            pid = int(term.screen.expect(r"pid=(\d+)").group(1))
            term.proc.send_signal(signal.SIGHUP)
            assert term.wait() == 128 + signal.SIGHUP
            from agent_sandbox.remote import RemoteProvider

            assert RemoteProvider(gateway.url, token).pty_open(sid, pid).wait(15) == 137
        finally:
            _kill(_abx(), env, sid)
    finally:
        gateway.stop()
        shutil.rmtree(Path(keys_file).parent, ignore_errors=True)


@pytest.fixture(scope="module")
def abx_group() -> Iterator[str]:
    created = False
    try:
        grp.getgrnam("abx")
    except KeyError:
        subprocess.run(["groupadd", "--system", "abx"], check=True, capture_output=True)
        created = True
    yield "abx"
    if created:
        subprocess.run(["groupdel", "abx"], capture_output=True)


def _user_env(user: Any, **extra: str) -> dict[str, str]:
    extra.setdefault("TERM", "xterm-256color")
    if os.environ.get("PYTHONPATH"):
        extra.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
    return user.env(**extra)


def test_shell_through_the_daemon_as_a_local_user(terminals: Any, local_users: Any,
                                                   abx_group: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="abx-shd-", dir="/tmp"))
    os.chmod(folder, 0o711)
    sock = str(folder / "abx.sock")
    daemon = subprocess.Popen([*_abx(), "serve", "--unix", sock, "--api-keys-file",
                               str(folder / "keys.db")], env=_base_env(),
                              stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            assert daemon.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        user = local_users.create(groups=(abx_group,))
        env = _user_env(user, ABX_ENGINE="daemon", ABX_DAEMON_SOCKET=sock)
        sid = _sandbox(user.argv(_abx()), env)
        try:
            drive(terminals(user.argv([*_abx(), "sandbox", "shell", sid]), env))
        finally:
            _kill(user.argv(_abx()), env, sid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


def test_shell_on_the_rootless_engine_as_a_local_user(terminals: Any,
                                                      local_users: Any) -> None:
    from agent_sandbox.backends.runc.host import subids

    subids.reserve()  # before useradd: the user's subuids must not be the root engine's
    user = local_users.create()
    probe = user.run(["unshare", "--user", "--map-root-user", "true"])
    if probe.returncode != 0:
        pytest.skip(f"unprivileged user namespaces do not work here: {probe.stderr.strip()}")
    env = _user_env(user, ABX_ENGINE="rootless")
    env.pop("ABX_DATA_DIR", None)
    sid = _sandbox(user.argv(_abx()), env)
    try:
        drive(terminals(user.argv([*_abx(), "sandbox", "shell", sid]), env))
    finally:
        _kill(user.argv(_abx()), env, sid)


def test_shell_needs_a_terminal(abx: Any) -> None:
    r = abx("sandbox", "shell", "sbx-0000000000", check=2)  # stdin is /dev/null
    assert "needs an interactive terminal" in r.err and "abx sandbox exec" in r.err
    assert "Traceback" not in r.err
