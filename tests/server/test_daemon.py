"""The shared daemon (``abx serve --unix``) with real local users, and engine selection.

The daemon runs as root on a unix socket (group ``abx``, 0660) in a 0711 temp dir; users
are made with ``useradd`` and run through ``setpriv``. User A drives it over the real STDIO
MCP server; user B (also in ``abx``) cannot touch A's sandbox; user C (not in ``abx``) is
refused by the socket's mode and, with the socket opened to everyone, by the daemon.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from agent_sandbox.core.errors import RuntimeUnavailableError

pytestmark = pytest.mark.integration

GROUP = "abx"
ABX = Path(sys.executable).parent / "abx"


@pytest.fixture(scope="module")
def abx_group() -> Iterator[str]:
    created = False
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, capture_output=True)
        created = True
    yield GROUP
    if created:
        subprocess.run(["groupdel", GROUP], capture_output=True)


def _health(path: str) -> int | None:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), timeout=5) as client:
            return client.get("http://abx/health").status_code
    except httpx.TransportError:
        return None


def _abx() -> list[str]:
    return [str(ABX)] if ABX.exists() else [sys.executable, "-m", "agent_sandbox.surfaces.cli"]


class Daemon:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = str(folder / "abx.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        env = {k: v for k, v in os.environ.items()
               if k not in ("ABX_SANDBOX_BASE_URL", "ABX_ENGINE")}
        self.proc = subprocess.Popen(
            [*_abx(), "serve", "--unix", self.socket, "--api-keys-file",
             str(self.folder / "keys.db")], env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"daemon exited with {self.proc.returncode}"
            if _health(self.socket) == 200:
                return self
            time.sleep(0.1)
        raise RuntimeError("the daemon did not answer in time")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture(scope="module")
def daemon(abx_group: str) -> Iterator[Daemon]:
    folder = Path(tempfile.mkdtemp(prefix="abx-daemon-", dir="/tmp"))
    os.chmod(folder, 0o711)  # users reach the socket, never list the folder
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(folder / "abx.sock"))  # left by a daemon that died: to be replaced
    stale.close()
    d = Daemon(folder).start()
    try:
        yield d
    finally:
        code = d.stop()
        gone = not os.path.exists(d.socket)
        shutil.rmtree(folder, ignore_errors=True)
    assert code == 0 and gone, "a stopped daemon exits 0 and removes its socket"


@pytest.fixture(scope="module")
def users(local_users: Any, abx_group: str) -> dict[str, Any]:
    return {"a": local_users.create(groups=(abx_group,)),
            "b": local_users.create(groups=(abx_group,)),
            "c": local_users.create()}


def as_user(user: Any, script: str, *, env: dict[str, str] | None = None,
            wrap: list[str] | None = None) -> dict[str, Any]:
    """Run a Python snippet as ``user``; it prints one JSON object as its last line."""
    argv = [*(wrap or []), user.python(), "-c", textwrap.dedent(script)]
    proc = user.run(argv, env=user.env(**(env or {})), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- the socket itself ----------------------------------------------------------------

def test_socket_is_group_abx_0660(daemon: Daemon) -> None:
    st = os.stat(daemon.socket)
    assert oct(st.st_mode & 0o777) == oct(0o660)
    assert grp.getgrgid(st.st_gid).gr_name == GROUP
    assert (os.stat(daemon.folder).st_mode & 0o777) == 0o711


def test_second_daemon_on_the_same_socket_is_refused(daemon: Daemon) -> None:
    proc = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.gateway", "serve",
                           "--unix", daemon.socket], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "already listens" in proc.stderr
    assert _health(daemon.socket) == 200  # the running one is untouched


# ---- 1. user A over the real STDIO MCP server ----------------------------------------

async def _call(client: Client, tool: str, **args: Any) -> tuple[bool, dict[str, Any], str]:
    r = await client.call_tool(tool, args)
    text = r.content[0].text if r.content else ""  # type: ignore[union-attr]
    return r.is_error, r.structured_content or {}, text


_OTHER_USER = """
    import json, sys
    from agent_sandbox.core.errors import SandboxError
    from agent_sandbox.providers.select import current_engine, default_provider
    sid = sys.argv[1] if len(sys.argv) > 1 else "{sid}"
    p = default_provider()
    out = {{"engine": current_engine().kind, "listed": [s.sandbox_id for s in p.list()]}}
    for name, call in {{"info": lambda: p.info(sid), "run": lambda: p.run(sid, "true"),
                       "read": lambda: p.read_file(sid, "/workspace/keep.txt"),
                       "write": lambda: p.write_file(sid, "/workspace/evil", b"x"),
                       "pause": lambda: p.pause(sid), "kill": lambda: p.kill(sid)}}.items():
        try:
            call()
            out[name] = "ok"
        except SandboxError as exc:
            out[name] = exc.code
    mine = p.create()
    out["own"] = p.run(mine.sandbox_id, "echo mine").stdout
    p.kill(mine.sandbox_id, delete_volume=True)
    print(json.dumps(out))
"""


def test_user_a_over_stdio_mcp_and_user_b_cannot_touch_it(daemon: Daemon,
                                                           users: dict[str, Any]) -> None:
    from agent_sandbox.providers.local import local_provider

    a, b = users["a"], users["b"]
    env = a.env(ABX_ENGINE="daemon", ABX_DAEMON_SOCKET=daemon.socket, ABX_MCP_TEMPLATE="base",
                ABX_MCP_AUDIT_LOG="")
    argv = a.argv([a.python(), "-m", "agent_sandbox.surfaces.mcp"])
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(a.home))
    seen: dict[str, Any] = {}

    async def body(c: Client) -> None:
        err, data, text = await _call(c, "create_sandbox", timeout=120)
        assert not err, text
        sid = seen["sid"] = data["sandbox"]["sandbox_id"]

        err, data, _ = await _call(c, "run_command", sandbox_id=sid, command="echo hi; id -u")
        assert not err and data["exit_code"] == 0 and data["stdout"].startswith("hi\n")

        err, data, _ = await _call(c, "write_file", sandbox_id=sid, path="/workspace/keep.txt",
                                   content="kept")
        assert not err
        err, data, text = await _call(c, "read_file", sandbox_id=sid,
                                      path="/workspace/keep.txt")
        assert not err and text == "kept"

        # System-layer writes, then pause/resume, then reset_rootfs undoes them.
        err, data, _ = await _call(c, "run_command", sandbox_id=sid,
                                   command="echo sys > /etc/abx-x && mkdir -p /usr/local/abx-x"
                                           " && cat /etc/abx-x")
        assert not err and data["stdout"] == "sys\n"
        err, data, _ = await _call(c, "pause_sandbox", sandbox_id=sid)
        assert not err and data["sandbox"]["state"] == "paused"
        err, data, _ = await _call(c, "resume_sandbox", sandbox_id=sid)
        assert not err and data["sandbox"]["state"] == "running"
        err, data, _ = await _call(c, "run_command", sandbox_id=sid, command="cat /etc/abx-x")
        assert data["stdout"] == "sys\n"
        err, data, _ = await _call(c, "reset_rootfs", sandbox_id=sid)
        assert not err
        err, data, _ = await _call(
            c, "run_command", sandbox_id=sid,
            command="test -e /etc/abx-x || echo etc-gone; test -e /usr/local/abx-x || "
                    "echo usr-gone; cat /workspace/keep.txt")
        assert data["stdout"] == "etc-gone\nusr-gone\nkept", data

        # The daemon knows A as its tenant: the sandbox belongs to A's uid.
        row = local_provider().backend.store.get_sandbox(sid)
        assert row is not None and row.owner == f"uid-{a.uid}"

        # 2. user B, a member of group abx too, cannot see or touch it (404, never 403).
        out = await anyio.to_thread.run_sync(lambda: as_user(
            b, _OTHER_USER.format(sid=sid),
            env={"ABX_ENGINE": "daemon", "ABX_DAEMON_SOCKET": daemon.socket}))
        assert out["engine"] == "daemon" and sid not in out["listed"]
        assert {k: out[k] for k in ("info", "run", "read", "write", "pause", "kill")} == {
            k: "not_found" for k in ("info", "run", "read", "write", "pause", "kill")}
        assert out["own"] == "mine\n"  # B works with its own sandboxes

        err, data, _ = await _call(c, "list_sandboxes")
        assert sid in {s["sandbox_id"] for s in data["sandboxes"]}  # untouched by B
        err, data, _ = await _call(c, "read_file", sandbox_id=sid, path="/workspace/evil")
        assert err and data["error"]["code"] == "not_found"
        err, data, _ = await _call(c, "kill_sandbox", sandbox_id=sid, delete_volumes=True)
        assert not err and data["killed"]

    async def main() -> None:
        async with Client(params, mode="legacy") as client:
            await body(client)

    anyio.run(main)
    assert local_provider().backend.store.get_sandbox(seen["sid"]) is None


# ---- 3. user C, outside group abx ---------------------------------------------------

_REFUSED = """
    import json
    from agent_sandbox.core.errors import SandboxError
    from agent_sandbox.providers.choice import choose_engine
    from agent_sandbox.remote import RemoteProvider
    out = {"choice": choose_engine().to_dict()}
    try:
        RemoteProvider("unix://%s", retry_seconds=1).list()
        out["list"] = "ok"
    except SandboxError as exc:
        out["list"] = [exc.code, exc.message]
    print(json.dumps(out))
"""


def test_user_outside_group_is_refused_by_socket_mode(daemon: Daemon,
                                                      users: dict[str, Any]) -> None:
    out = as_user(users["c"], _REFUSED % daemon.socket,
                  env={"ABX_ENGINE": "daemon", "ABX_DAEMON_SOCKET": daemon.socket})
    assert out["choice"]["kind"] is None
    assert "may not open it" in out["choice"]["error"]
    assert "usermod -aG abx" in out["choice"]["error"]
    code, message = out["list"]
    assert code == "permission_denied"
    assert "permission denied" in message and "group (abx)" in message


def test_user_outside_group_gets_403_even_through_an_open_socket(
        daemon: Daemon, users: dict[str, Any]) -> None:
    os.chmod(daemon.socket, 0o666)
    try:
        out = as_user(users["c"], _REFUSED % daemon.socket)
        code, message = out["list"]
        assert code == "permission_denied"
        assert f"user {users['c'].name} (uid {users['c'].uid}) may not use this abx daemon" \
            in message and "group 'abx'" in message
        # Every path, unauthenticated /health included, and no way around it with a key.
        raw = as_user(users["c"], f"""
            import json, httpx2 as httpx
            t = httpx.HTTPTransport(uds={daemon.socket!r})
            auth = {{"Authorization": "Bearer abx_x"}}
            with httpx.Client(transport=t, base_url="http://abx", headers=auth) as c:
                codes = [c.get(p).status_code
                         for p in ("/health", "/openapi.json", "/v1/sandboxes")]
            print(json.dumps({{"codes": codes}}))
        """)
        assert raw["codes"] == [403, 403, 403]
    finally:
        os.chmod(daemon.socket, 0o660)


# ---- 4. selection --------------------------------------------------------------------

_CHOICE = """
    import json
    from agent_sandbox.core.errors import SandboxError
    from agent_sandbox.providers.select import current_engine, default_provider
    out = {"choice": current_engine().to_dict()}
    try:
        out["provider"] = type(default_provider()).__name__
    except SandboxError as exc:
        out["provider"] = exc.code
    print(json.dumps(out))
"""


def _userns_works_for(user: Any) -> bool:
    return user.run(["unshare", "--user", "--map-root-user", "true"]).returncode == 0


def _without_userns(user: Any) -> list[str]:
    """A prefix that runs a command as ``user`` unable to make user namespaces: a
    per-namespace limit of 1, used up by the namespace it runs in."""
    return ["unshare", "--user", "--map-root-user", "sh", "-c",
            'echo 1 > /proc/sys/user/max_user_namespaces && exec unshare --user '
            f'--map-user={user.uid} --map-group={user.gid} "$@"', "wrap"]


def test_selection_automatic_order_as_real_users(daemon: Daemon,
                                                 users: dict[str, Any]) -> None:
    a, c = users["a"], users["c"]
    # Non-root, daemon reachable → daemon.
    out = as_user(a, _CHOICE, env={"ABX_DAEMON_SOCKET": daemon.socket})
    assert out["choice"]["kind"] == "daemon" and out["choice"]["target"] == daemon.socket
    assert out["provider"] == "RemoteProvider"
    # Non-root, the daemon refuses this user (socket mode) → rootless where userns works.
    out = as_user(c, _CHOICE, env={"ABX_DAEMON_SOCKET": daemon.socket})
    if _userns_works_for(c):
        assert out["choice"]["kind"] == "rootless", out
        assert "may not open it" in out["choice"]["reason"]
    else:
        assert out["choice"]["kind"] is None
    # ABX_SANDBOX_BASE_URL still wins over everything automatic.
    out = as_user(a, _CHOICE, env={"ABX_DAEMON_SOCKET": daemon.socket,
                                   "ABX_SANDBOX_BASE_URL": "http://127.0.0.1:9"})
    assert out["choice"]["kind"] == "remote" and out["provider"] == "RemoteProvider"
    # ABX_ENGINE forces: rootless despite a reachable daemon; embedded refused as a user.
    out = as_user(a, _CHOICE, env={"ABX_DAEMON_SOCKET": daemon.socket,
                                   "ABX_ENGINE": "rootless"})
    assert out["choice"]["forced"]
    if _userns_works_for(a):
        assert out["choice"]["kind"] == "rootless" and out["provider"] == "SandboxService", out
    else:
        assert out["choice"]["kind"] is None and "abx doctor" in out["choice"]["error"]
    out = as_user(a, _CHOICE, env={"ABX_ENGINE": "daemon", "ABX_DAEMON_SOCKET": daemon.socket})
    assert out["choice"]["kind"] == "daemon" and out["provider"] == "RemoteProvider"
    out = as_user(a, _CHOICE, env={"ABX_ENGINE": "kvm"})
    assert out["provider"] == "runtime_unavailable"
    assert "'kvm' is not one of embedded, rootless, daemon" in out["choice"]["error"]
    out = as_user(a, _CHOICE, env={"ABX_ENGINE": "embedded"})
    assert out["choice"]["kind"] is None and "needs root" in out["choice"]["error"]
    assert out["provider"] == "runtime_unavailable"
    # `abx doctor` (named by every such error) shows the choice first.
    proc = a.run([*_abx(), "doctor", "--json"], env=a.env(ABX_DAEMON_SOCKET=daemon.socket))
    engine = json.loads(proc.stdout)["checks"][0]
    assert engine["name"] == "engine" and engine["ok"]
    assert engine["detail"].startswith(f"daemon at {daemon.socket}")


def test_selection_clear_error_when_nothing_works(users: dict[str, Any]) -> None:
    """No daemon and user namespaces exhausted (a per-namespace limit of 1, used up by the
    namespace the process runs in): the error names every fix."""
    c = users["c"]
    if not _userns_works_for(c):
        pytest.skip("unprivileged user namespaces are off here: the wrapper needs one")
    wrap = _without_userns(c)
    out = as_user(c, _CHOICE, env={"ABX_DAEMON_SOCKET": "/nonexistent/abx.sock"}, wrap=wrap)
    assert out["choice"]["kind"] is None and out["provider"] == "runtime_unavailable"
    error = out["choice"]["error"]
    for fix in ("no daemon socket at /nonexistent/abx.sock", "user namespaces",
                "abx daemon install", "usermod -aG abx", "sysctl", "abx doctor"):
        assert fix in error, (fix, error)


def test_doctor_passes_for_a_daemon_user_without_user_namespaces(
        daemon: Daemon, users: dict[str, Any]) -> None:
    """Served by the daemon, a user needs no local engine: the rootless check only warns."""
    a = users["a"]
    if not _userns_works_for(a):
        pytest.skip("unprivileged user namespaces are off here: the wrapper needs one")
    wrap = _without_userns(a)
    own = a.home / "abx-data"  # a local data dir exists, yet the daemon's templates count
    a.run(["mkdir", "-p", str(own)])
    proc = a.run([*wrap, *_abx(), "doctor", "--json"],
                 env=a.env(ABX_DAEMON_SOCKET=daemon.socket, ABX_DATA_DIR=str(own)))
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["engine"]["ok"] and checks["engine"]["detail"].startswith("daemon")
    assert not checks["engine mode"]["ok"] and not checks["engine mode"]["required"]
    assert checks["templates"]["ok"] and "base" in checks["templates"]["detail"], checks
    assert report["ok"] and proc.returncode == 0, proc.stdout


def test_selection_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_sandbox.providers import choice as engine_choice
    from agent_sandbox.providers.select import current_engine, default_provider

    for name in ("ABX_ENGINE", "ABX_SANDBOX_BASE_URL", "ABX_DAEMON_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    assert engine_choice.choose_engine().kind == "embedded"  # we are root
    monkeypatch.setenv("ABX_ENGINE", "rootless")
    assert "ordinary users" in (engine_choice.choose_engine().error or "")
    monkeypatch.setenv("ABX_ENGINE", "podman")
    assert "not one of" in (engine_choice.choose_engine().error or "")
    monkeypatch.setenv("ABX_ENGINE", "daemon")
    monkeypatch.setenv("ABX_DAEMON_SOCKET", "/nonexistent/abx.sock")
    choice = current_engine()
    assert choice.kind is None and "abx daemon install" in (choice.error or "")
    with pytest.raises(RuntimeUnavailableError, match="ABX_ENGINE=daemon but no daemon socket"):
        default_provider()
    monkeypatch.setenv("ABX_ENGINE", "embedded")
    assert current_engine().kind == "embedded"
