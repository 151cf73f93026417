"""The host must never trust the sandbox: attacks on the engine's own host-side code.

Each attack is made from inside a sandbox (its root can write its run directory, its
system layer, its workspace, and can end its guest with ``kill -TERM 1``), then the
engine is made to act: a guest reboot, ``reset_rootfs``, a failed start. Nothing on the
host may be created, read, connected to or blocked on because of what the sandbox planted.
Run as root here and as an ordinary user by ``rootless_battery.py``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration

HOST_ID_BASE = 100000


def _data() -> Path:
    return Path(os.environ["ABX_DATA_DIR"])


def _sbdir(sb: Sandbox) -> Path:
    return _data() / "sandboxes" / sb.sandbox_id


def _end_guest(sb: Sandbox) -> None:
    """The sandbox ends its own pid 1 (as any sandbox can), so the next use reboots it."""
    sb.commands.run("(sleep 0.3; kill -TERM 1) >/dev/null 2>&1 &", timeout=10)
    time.sleep(1.0)


def _within(seconds: float, fn: Callable[[], object]) -> object:
    """fn() in a thread; fails the test (instead of hanging it) if it blocks."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the engine blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.fixture
def tag() -> str:
    return "abx-hostile-" + secrets.token_hex(6)


def _host_target(tag: str) -> Path:
    """A host path (that the engine's user could create) the sandbox aims its links at."""
    return Path("/var/tmp") / f"{tag}-pwned"


@contextlib.contextmanager
def _host_listener(tag: str) -> Iterator[tuple[str, socket.socket]]:
    """A host unix socket anyone may connect to: following a planted link reaches it."""
    folder = Path("/var/tmp") / f"{tag}-sock"
    folder.mkdir()
    os.chmod(folder, 0o777)
    path = str(folder / "s")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(path)
        os.chmod(path, 0o777)
        srv.listen(8)
        srv.settimeout(0.5)
        yield path, srv
    finally:
        srv.close()
        Path(path).unlink(missing_ok=True)
        folder.rmdir()


def _assert_never_connected(srv: socket.socket) -> None:
    try:
        conn, _ = srv.accept()
    except TimeoutError:
        return
    conn.close()
    raise AssertionError("the engine connected to a host socket the sandbox linked to")


PLANTED = ("guest.log", "guest.sock", "slirp.log", "guest.pid", "kernel.json")


def _plant_links(sb: Sandbox, target: str, names: tuple[str, ...] = PLANTED) -> None:
    links = " ".join(f"/.abx/run/{n}" for n in names)
    res = sb.commands.run(f"for l in {links}; do rm -f $l; ln -s '{target}' $l; done; "
                          "ls -la /.abx/run")
    assert res.exit_code == 0, res


# 1. host file create/append through a planted link --------------------------------------
def test_planted_links_are_not_followed_on_reboot(sandbox: Sandbox, tag: str) -> None:
    host_target = _host_target(tag)
    _plant_links(sandbox, str(host_target))
    _end_guest(sandbox)
    assert sandbox.commands.run("echo back").stdout == "back\n"  # rebooted
    assert not host_target.exists() and not host_target.is_symlink()
    _plant_links(sandbox, str(host_target))
    sandbox.reset_rootfs()
    assert sandbox.commands.run("echo reset").stdout == "reset\n"
    assert not host_target.exists() and not host_target.is_symlink()


# 2. host file read: a failed start must not quote a planted link -------------------------
def test_sabotaged_interpreter_and_log_link_leak_nothing(sandbox: Sandbox, tag: str) -> None:
    """The sandbox replaces every python3 in its writable /usr with a program that never
    answers and links the old log name to a host secret: the guest still comes up (it
    runs from a read-only view of the host), and no error carries the secret."""
    secret = secrets.token_hex(16)
    secret_file = Path("/var/tmp") / f"{tag}-secret"
    secret_file.write_text(secret)
    os.chmod(secret_file, 0o600)
    try:
        _plant_links(sandbox, str(secret_file), ("guest.log",))
        res = sandbox.commands.run(
            "for p in /usr/bin/python3* /usr/local/bin/python3* /bin/python3*; do "
            "[ -e \"$p\" ] || continue; rm -f \"$p\"; "
            "printf '#!/bin/sh\\nsleep 3600\\n' > \"$p\"; chmod 755 \"$p\"; done; echo done")
        assert "done" in res.stdout, res
        _end_guest(sandbox)
        try:
            out = _within(30, lambda: sandbox.commands.run("echo alive").stdout)
        except Exception as exc:  # noqa: BLE001 - a failure must not leak either
            assert secret not in str(exc), exc
            raise
        assert out == "alive\n"
    finally:
        secret_file.unlink(missing_ok=True)


# 3. guest socket swap --------------------------------------------------------------------
def test_socket_links_reach_neither_host_nor_other_sandbox(sandbox: Sandbox, tag: str) -> None:
    with _host_listener(tag) as (path, srv), Sandbox.create() as other:
        # Every place the engine ever kept a guest socket, of the other sandbox and ours.
        others = [str(_sbdir(other) / "run" / "guest.sock"), str(_sbdir(other) / "guest.sock")]
        _plant_links(sandbox, path, ("guest.sock",))
        for i, target in enumerate(others):
            sandbox.commands.run(f"ln -sf '{target}' /.abx/run/other{i}.sock")
        sandbox.commands.run(f"ln -sf '{others[0]}' /.abx/run/guest.sock")
        for _ in range(2):
            assert sandbox.commands.run("hostname").stdout.strip() == sandbox.sandbox_id
            _end_guest(sandbox)
        assert sandbox.commands.run("hostname").stdout.strip() == sandbox.sandbox_id
        assert other.commands.run("hostname").stdout.strip() == other.sandbox_id
        _assert_never_connected(srv)


# 4. a FIFO where the engine once opened its log -----------------------------------------
def test_planted_fifo_blocks_nothing(sandbox: Sandbox) -> None:
    res = sandbox.commands.run("rm -f /.abx/run/guest.log /.abx/run/slirp.log && "
                               "mkfifo /.abx/run/guest.log /.abx/run/slirp.log && echo ok")
    assert res.stdout == "ok\n", res
    _end_guest(sandbox)
    assert _within(30, lambda: sandbox.commands.run("echo up").stdout) == "up\n"
    _within(60, sandbox.reset_rootfs)
    assert sandbox.commands.run("echo reset").stdout == "reset\n"
    with Sandbox.create() as other:  # the engine's other sandboxes are not held up
        assert _within(30, lambda: other.commands.run("echo free").stdout) == "free\n"


# 6. setuid and device files through the host's view of sandbox data ---------------------
def test_host_views_of_sandbox_data_are_inert(sandbox: Sandbox) -> None:
    """A setuid shell the sandbox leaves in /workspace or its system layer means nothing
    on the host: the host mounts carry nosuid,nodev and no other host user can even reach
    them (root: root:HOST_ID_BASE 0710 directories; rootless: the user's 0700)."""
    res = sandbox.commands.run("cp /bin/sh /workspace/sh && chmod 4755 /workspace/sh && "
                               "cp /bin/sh /usr/local/bin/suid-sh && "
                               "chmod 4755 /usr/local/bin/suid-sh && echo ok")
    assert res.stdout == "ok\n", res
    data, sbdir = _data(), _sbdir(sandbox)
    for folder in (data, data / "sandboxes", sbdir):
        mode = stat.S_IMODE(folder.stat().st_mode)
        assert mode & 0o007 == 0, f"{folder} is {oct(mode)}: other host users can enter"
    if os.geteuid() != 0:
        return  # rootless: nothing is mounted on the host; 0700 is the whole story
    for folder in (data, data / "sandboxes", sbdir):
        st = folder.stat()
        assert st.st_uid == 0 and (st.st_gid == HOST_ID_BASE or not st.st_mode & 0o070)
    mounts = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mounts[fields[4]] = fields[5].split(",")
    under = [m for m in mounts if m.startswith(str(sbdir) + "/")]
    assert {str(sbdir / "disk"), str(sbdir / "rootfs")} <= set(under), under
    for mount in under:
        assert "nosuid" in mounts[mount] and "nodev" in mounts[mount], (mount, mounts[mount])
    for mount in (m for m in mounts if m.startswith(str(data / "idmap") + "/")
                  or m == str(data / "stage")):
        assert "nosuid" in mounts[mount] and "nodev" in mounts[mount], (mount, mounts[mount])
    # A local user tries the setuid shells (as the red team did).
    for shell in (sbdir / "disk" / "workspace" / "sh", sbdir / "rootfs/usr/local/bin/suid-sh"):
        assert shell.stat().st_mode & stat.S_ISUID  # the attack is in place...
        # (through a shell: setpriv itself would look the program up before dropping root)
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               "/bin/sh", "-c", f"'{shell}' -c 'id -u'"],
                              capture_output=True, text=True)
        assert proc.returncode != 0 and proc.stdout.strip() != str(HOST_ID_BASE), proc


# 7. what the sandbox sees of the host -----------------------------------------------------
def test_own_cgroup_namespace(sandbox: Sandbox) -> None:
    out = sandbox.commands.run("cat /proc/self/cgroup").stdout
    assert out.strip(), out
    for line in out.splitlines():
        assert line.rsplit(":", 1)[1] == "/", f"the host's cgroup path is visible: {line}"
    assert sandbox.sandbox_id not in out
