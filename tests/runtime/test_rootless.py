"""The rootless engine, as a real unprivileged user: the STDIO MCP server end to end, the
hostile battery, and the limits it reports really holding."""

from __future__ import annotations

import json
import os
import secrets
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import rootless_battery
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from wheels import wheel_script

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


@pytest.fixture(scope="module")
def user(local_users: Any) -> Iterator[Any]:
    """An unprivileged user with working rootless sandboxes (skips where the host lacks
    unprivileged user namespaces)."""
    made = local_users.create_rootless()
    yield made
    made.clear_engine()


# Run inside the sandbox: a wheel installed by pip into the system site-packages and a
# .deb installed by dpkg (files owned by root and then by id 1000, its database updated),
# both built there, offline.
_WHEEL = wheel_script("abxmark")
_INSTALL = "\n".join([
    "set -e", "cd /workspace",
    f"python3 -c {shlex.quote(_WHEEL)}",
    "python3 -m pip install -q --no-index --break-system-packages "
    "--root-user-action=ignore abxmark-1.0-py3-none-any.whl",
    "python3 -c 'import abxmark; print(abxmark.X)'",
    "mkdir -p pkg/DEBIAN pkg/usr/share/abx-marker pkg/etc",
    "printf 'Package: abx-marker\\nVersion: 1.0\\nArchitecture: all\\n"
    "Maintainer: t <t@example.com>\\nDescription: t\\n' > pkg/DEBIAN/control",
    "echo data > pkg/usr/share/abx-marker/data", "echo conf > pkg/etc/abx-marker",
    "dpkg-deb --root-owner-group -b pkg abx_marker.deb >/dev/null",
    "dpkg -i abx_marker.deb >/dev/null",
    "chown 1000:1000 /usr/share/abx-marker/data",
    "dpkg -s abx-marker | grep -q 'install ok installed' && echo abx-marker installed",
])


def _data_dir(user: Any) -> Path:
    return user.home / ".local" / "share" / "agent-sandbox"


def _runc_pid(user: Any, sandbox_id: str) -> int:
    proc = user.run(["runc", "--root", str(_data_dir(user) / "runc"), "state", sandbox_id])
    assert proc.returncode == 0, proc.stderr
    return int(json.loads(proc.stdout)["pid"])


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        out += map(int, children)
        todo += map(int, children)
    return out


def _states(pids: list[int]) -> list[str]:
    states = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        states.append(next(ln.split()[1] for ln in status.splitlines()
                           if ln.startswith("State:")))
    return states


async def _call(client: Client, tool: str, **args: Any) -> tuple[bool, dict[str, Any], str]:
    r = await client.call_tool(tool, args)
    text = r.content[0].text if r.content else ""  # type: ignore[union-attr]
    return r.is_error, r.structured_content or {}, text


def test_mcp_stdio_as_unprivileged_user(user: Any) -> None:
    """The STDIO server started as the user (as an IDE would) runs on the rootless engine:
    create, run, write/read, pause/resume, reset_rootfs, kill."""
    argv = user.argv([user.python(), "-m", "agent_sandbox.surfaces.mcp"])
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], cwd=str(user.home),
        env=user.env(ABX_MCP_TEMPLATE="base", ABX_MCP_AUDIT_LOG=""))
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Client(params, mode="legacy") as c:
            err, data, text = await _call(c, "create_sandbox")
            assert not err, text
            sid = data["sandbox"]["sandbox_id"]
            seen["sid"] = sid
            assert data["sandbox"]["template"] == "base"
            assert data["sandbox"]["enforced"].get("memory_per_process") is True

            err, data, text = await _call(c, "run_command", sandbox_id=sid,
                                          command="id -u; python3 -c 'print(6*7)'")
            assert not err and data["exit_code"] == 0 and data["stdout"] == "0\n42\n", text
            pid1 = _runc_pid(user, sid)
            uid = int(next(ln.split()[1] for ln in Path(f"/proc/{pid1}/status").read_text()
                           .splitlines() if ln.startswith("Uid:")))
            assert uid == user.uid  # the user's own uid is the sandbox's root

            err, data, text = await _call(c, "write_file", sandbox_id=sid,
                                          path="/workspace/keep.txt", content="kept")
            assert not err, text
            err, data, text = await _call(c, "read_file", sandbox_id=sid,
                                          path="/workspace/keep.txt")
            assert not err and text == "kept", text

            # System-layer writes: a real pip install and a real dpkg -i (copy-up of the
            # user-owned template, files given to other ids); reset_rootfs undoes them.
            err, data, text = await _call(c, "run_command", sandbox_id=sid,
                                          command=_INSTALL, timeout=120)
            assert not err and data["exit_code"] == 0, text
            assert data["stdout"].splitlines()[-2:] == ["42", "abx-marker installed"], text

            err, data, text = await _call(c, "run_command", sandbox_id=sid,
                                          command="sleep 1000", background=True)
            assert not err, text
            err, data, text = await _call(c, "pause_sandbox", sandbox_id=sid)
            assert not err and data["sandbox"]["state"] == "paused", text
            kids = _descendants(pid1)
            assert kids and set(_states(kids)) == {"T"}, _states(kids)  # all stopped
            err, data, text = await _call(c, "resume_sandbox", sandbox_id=sid)
            assert not err and data["sandbox"]["state"] == "running", text
            assert "T" not in _states(kids)

            err, data, text = await _call(c, "reset_rootfs", sandbox_id=sid)
            assert not err, text
            err, data, text = await _call(c, "run_command", sandbox_id=sid, command=(
                "python3 -c 'import abxmark' 2>&1 | tail -1; dpkg -s abx-marker 2>&1 | head -1;"
                " ls /usr/share/abx-marker /etc/abx-marker 2>&1 | grep -c 'No such';"
                " ls /workspace"))
            assert not err, text
            lines = data["stdout"].splitlines()
            assert "No module named 'abxmark'" in lines[0], text
            assert "abx-marker" in lines[1] and "not installed" in lines[1], text
            assert lines[2] == "2", text
            assert sorted(lines[3:]) == ["abx_marker.deb", "abxmark-1.0-py3-none-any.whl",
                                         "keep.txt", "pkg"], text
            err, data, text = await _call(c, "read_file", sandbox_id=sid,
                                          path="/workspace/keep.txt")
            assert not err and text == "kept", text

            err, data, text = await _call(c, "kill_sandbox", sandbox_id=sid,
                                          delete_volumes=True)
            assert not err and data["killed"], text
            err, data, text = await _call(c, "list_sandboxes")
            assert sid not in json.dumps(data)

    anyio.run(main)
    assert not (_data_dir(user) / "sandboxes" / seen["sid"]).exists()


def test_run_code_as_unprivileged_user(user: Any, code_template: str) -> None:
    """What an IDE gets by default: the STDIO server's code-interpreter-v1, the one root
    built for every user (no copy in the user's data dir), and a real kernel in a
    rootless sandbox."""
    argv = user.argv([user.python(), "-m", "agent_sandbox.surfaces.mcp"])
    params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(user.home),
                                   env=user.env(ABX_MCP_AUDIT_LOG=""))

    async def main() -> None:
        async with Client(params, mode="legacy") as c:
            err, data, text = await _call(
                c, "run_code", code="import numpy as np\nx = int(np.arange(4).sum())\nx",
                timeout=120)
            if err and "registry could not be reached" in text:
                pytest.skip("code-interpreter-v1 cannot be built: the registry is unreachable")
            assert not err and data["results"][0]["text"] == "6", text
            err, data, text = await _call(c, "run_code", code="x * 7")  # state kept
            assert not err and data["results"][0]["text"] == "42", text

    anyio.run(main)
    assert not (_data_dir(user) / "templates" / code_template).exists()
    assert (_data_dir(user) / "templates" / "_shared" / code_template).is_dir()


def test_doctor_as_unprivileged_user(user: Any) -> None:
    """``abx doctor`` names the rootless mode, the id mapping and what each limit really
    is; where no cgroup is delegated it says so (and the battery's rootless_limits shows
    the rlimits it claims instead really hold)."""
    proc = user.run([user.python(), "-m", "agent_sandbox.surfaces.cli", "doctor", "--json"])
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and proc.returncode == 0, proc.stdout
    mode = checks["engine mode"]["detail"]
    assert f"rootless engine as uid {user.uid}" in mode and f"uid {user.uid} -> 0" in mode
    assert "subuids" in mode  # uidmap is installed (setup.sh) and useradd gave a range
    assert checks["newuidmap"]["ok"]
    limits = checks["limits enforced"]
    cgroup_v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    if not cgroup_v2:  # v1/hybrid never delegates to users: rlimits, said plainly
        assert not limits["ok"] and limits["fix"], limits
        assert "memory: per process only: RLIMIT_AS" in limits["detail"], limits
        assert "cpu: not enforced" in limits["detail"], limits
    assert "disk: not enforced" in limits["detail"], limits


# the hostile battery ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def battery(user: Any) -> Iterator[dict[str, str]]:
    """Runs rootless_battery.py once as the user; host canaries made here, as root."""
    canaries = {}
    tag = "abx-canary-" + secrets.token_hex(6)
    spots = [(Path("/root") / tag, 0o644, 0), (Path("/etc") / tag, 0o600, 0),
             (user.home / tag, 0o600, user.uid)]
    try:
        for path, mode, owner in spots:
            secret = secrets.token_hex(16)
            path.write_text(secret)
            os.chmod(path, mode)
            os.chown(path, owner, owner)
            canaries[str(path)] = secret
        proc = user.run([user.python(), str(HERE / "rootless_battery.py")],
                        env=user.env(ABX_CANARIES=json.dumps(canaries)), timeout=600)
    finally:
        for path, _, _ in spots:
            path.unlink(missing_ok=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", rootless_battery.names())
def test_hostile_as_unprivileged_user(battery: dict[str, str], name: str) -> None:
    result = battery[name]
    if result.startswith("skip: "):
        pytest.skip(result[len("skip: "):])
    assert result == "ok", result


# secrets ------------------------------------------------------------------------------------
# Run as the user: its own secret, one rootless sandbox, one request the proxy puts the value
# in and one it refuses (the placeholder in another header), and the sandbox's environment.
_SECRETS = r"""
import json, sys
from agent_sandbox import Sandbox, Secret
port, value = sys.stdin.read().split()
if "gh" in {s.name for s in Secret.list()}:
    Secret.delete("gh")
Secret.create("gh", hosts=[f"api.secret.test:{port}"], env="GH_TOKEN", value=value)
probe = '''
import http.client, json, os
out = []
for path, headers in (("/ok", {"Authorization": "Bearer " + os.environ["GH_TOKEN"]}),
                      ("/k", {"X-Other": os.environ["GH_TOKEN"]})):
    c = http.client.HTTPSConnection("api.secret.test", PORT, timeout=10)
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    out.append([r.status, r.getheader("X-Echo"), r.read().decode(errors="replace")])
print(json.dumps(out))
'''.replace("PORT", port)
with Sandbox.create(network=["api.secret.test"], secrets=["gh"]) as sb:
    sb.files.write("/tmp/probe.py", probe)
    res = sb.commands.run("python3 /tmp/probe.py", timeout=60)
    env = sb.commands.run("env").stdout
print(json.dumps({"exit": res.exit_code, "stderr": res.stderr[-2000:],
                  "out": res.stdout.strip().splitlines()[-1:], "env": env}))
"""


def test_secrets_as_unprivileged_user(user: Any, tmp_path: Path) -> None:
    """The rootless engine injects a user's secret exactly as the root one does: the value
    reaches its host (a real TLS server on loopback), the placeholder elsewhere is refused
    naming the rule, and the value is not in the sandbox."""
    from netprobe import ENV, secret_hosts

    value = "ghp_R00tlessSecretValue_" + secrets.token_hex(8)
    with secret_hosts(tmp_path) as (ports, seen, _):
        proc = user.run([user.python(), "-c", _SECRETS], env=user.env(**ENV),
                        input=f"{ports[0]} {value}\n", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["exit"] == 0 and got["out"], got
    assert value not in proc.stdout  # nothing the sandbox saw or answered holds it
    ok, refused = json.loads(got["out"][0])
    assert ok[0] == 200 and ok[1] == "*" * len(f"Bearer {value}"), ok
    assert [s for s in seen if s["path"] == "/ok"][0]["headers"]["Authorization"] == \
        f"Bearer {value}"
    assert refused[0] == 403 and "secret gh goes only to" in refused[2], refused
    assert not any(s["path"] == "/k" for s in seen)
    assert "GH_TOKEN=abx-secret:gh" in got["env"]
