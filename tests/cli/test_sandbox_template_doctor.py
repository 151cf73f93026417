"""``abx sandbox``, ``abx template`` and ``abx doctor`` on this host's engine."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import Abx

from agent_sandbox.backends.runc import supervisor
from agent_sandbox.backends.runc.rootfs.overlay import mounts_under
from agent_sandbox.core.netrules import PRESETS

pytestmark = pytest.mark.integration

BUSYBOX = shutil.which("busybox")


def test_sandbox_lifecycle(abx: Abx, tmp_path: Path) -> None:
    sid = abx("sandbox", "create", "--memory-mb", "256", "--env", "GREETING=hi", "--json",
              timeout=120).json()["sandbox_id"]
    try:
        assert sid in {s["sandbox_id"] for s in abx("sandbox", "list", "--json").json()}
        assert sid in abx("sandbox", "list").out  # the Rich table, id not cut
        info = abx("sandbox", "info", sid, "--json").json()
        assert info["state"] == "running" and info["env_names"] == ["GREETING"]
        # Its use, read from its cgroup: the memory limit asked for is the total.
        assert info["usage"]["mem_total"] == 256 << 20 and info["usage"]["mem_used"] > 0
        assert "memory " in abx("sandbox", "info", sid).out
        top = abx("sandbox", "top", "--json").json()
        assert [m["mem_total"] for m in top if m["sandbox_id"] == sid] == [256 << 20]
        assert sid in abx("sandbox", "top").out
        r = abx("sandbox", "exec", sid, 'echo "$GREETING out"; echo err >&2; exit 3', check=3)
        assert r.out == "hi out\n" and r.err == "err\n"
        assert abx("sandbox", "exec", sid, "--", "python3", "-c", "print(6*7)").out == "42\n"
        res = abx("sandbox", "exec", sid, "--json", "exit 5", check=5).json()
        assert res["exit_code"] == 5
        local = tmp_path / "data.bin"
        local.write_bytes(os.urandom(300_000))
        abx("sandbox", "upload", sid, str(local), "/workspace/data.bin")
        back = tmp_path / "back.bin"
        abx("sandbox", "download", sid, "/workspace/data.bin", str(back))
        assert back.read_bytes() == local.read_bytes()
        assert abx("sandbox", "pause", sid, "--json").json()["state"] == "paused"
        assert abx("sandbox", "resume", sid, "--json").json()["state"] == "running"
        abx("sandbox", "exec", sid, "touch /etc/marker")
        abx("sandbox", "reset", sid)
        abx("sandbox", "exec", sid, "test ! -e /etc/marker && test -e /workspace/data.bin")
        # The base template has no kernel (an SDK without run_code says so too).
        r = abx("sandbox", "run-code", sid, "print(1)", check=1)
        assert "not available in this build yet" in r.err or "no code interpreter" in r.err
    finally:
        abx("sandbox", "kill", sid, "--delete-volume", check=None)
    r = abx("sandbox", "info", sid, check=1)
    assert "not found" in r.err


def test_sandbox_errors(abx: Abx) -> None:
    assert "not found" in abx("sandbox", "exec", "sbx-0000000000", "true", check=1).err
    assert "invalid sandbox id" in abx("sandbox", "info", "nope", check=2).err
    assert "NAME=VALUE" in abx("sandbox", "create", "--env", "JUNK", check=2).err


@pytest.mark.skipif(BUSYBOX is None, reason="needs busybox (apt-get install busybox-static)")
def test_template_build_list_remove(abx: Abx, tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(str(BUSYBOX), root / "bin" / "busybox")
    for applet in ("sh", "echo", "ls", "cat", "id"):
        os.symlink("busybox", root / "bin" / applet)
    name = f"cli-tmpl-{os.getpid()}"
    r = abx("template", "build", name, str(root), "--description", "cli test", timeout=180)
    assert f"template {name} ready" in r.out
    try:
        listed = {t["name"]: t for t in abx("template", "list", "--json").json()}
        assert listed[name]["description"] == "cli test" and "base" in listed
        sid = abx("sandbox", "create", "--template", name, "--json",
                  timeout=120).json()["sandbox_id"]
        try:
            assert abx("sandbox", "exec", sid, "echo hi").out == "hi\n"
            assert "used by sandboxes" in abx("template", "remove", name, check=1).err
        finally:
            abx("sandbox", "kill", sid, "--delete-volume")
    finally:
        abx("template", "remove", name, check=None)
    assert name not in {t["name"] for t in abx("template", "list", "--json").json()}
    assert "does not exist" in abx("template", "build", "x", str(tmp_path / "nope"),
                                   check=2).err


def test_template_build_code_interpreter_says_which_index_failed(abx: Abx, tmp_path: Path
                                                                 ) -> None:
    """``abx template build code-interpreter-v1`` from an index nobody answers on fails at
    once, naming it and the fix; other names still need a source."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/simple"
    env = {"ABX_SHARED_TEMPLATES_DIR": str(tmp_path / "shared")}  # nothing built there
    r = abx("template", "build", "code-interpreter-v1", "--index-url", url, "--replace",
            env=env, check=1)
    assert f"its package index {url} is unreachable" in r.err, r.err
    assert "abx template build code-interpreter-v1 --index-url URL" in r.err, r.err
    assert not (tmp_path / "shared" / "code-interpreter-v1").exists()
    assert "only code-interpreter-v1 is built without one" in abx(
        "template", "build", "mytools", check=2).err
    assert "--index-url is for code-interpreter-v1" in abx(
        "template", "build", "mytools", str(tmp_path), "--index-url", url, check=2).err


def test_doctor(abx: Abx) -> None:
    r = abx("doctor", "--json", check=None)
    report = r.json()
    checks = {c["name"]: c for c in report["checks"]}
    assert {"engine", "engine mode", "container runtime", "namespaces", "user namespaces",
            "overlayfs", "cgroup controllers", "limits enforced", "seccomp",
            "data dir", "disk headroom"} <= set(checks)
    assert "GB free on" in checks["disk headroom"]["detail"]
    # As root: the root engine, and each limit said to be enforced or not.
    assert checks["engine mode"]["detail"].startswith("root engine")
    limits = dict(part.split(": ") for part in checks["limits enforced"]["detail"].split(", "))
    assert set(limits) == {"memory", "pids", "cpu", "disk"}
    assert set(limits.values()) <= {"yes", "NO"}
    cgroup = Path("/sys/fs/cgroup")
    memory = (cgroup / "memory").is_dir() or "memory" in (
        (cgroup / "cgroup.controllers").read_text() if (cgroup / "cgroup.controllers").exists()
        else "")
    assert limits["memory"] == ("yes" if memory else "NO")
    assert r.code == (0 if report["ok"] else 1)
    assert all(c["fix"] for c in report["checks"] if not c["ok"])
    assert report["ok"]  # the suite runs sandboxes on this host, so it must pass here
    proxy = checks["network proxy"]  # started as the engine starts it, a lookup proven
    assert proxy["ok"] and "as nobody (uid 65534); name lookups work" in proxy["detail"]


def test_doctor_says_which_registries_a_sandbox_cannot_reach_and_the_fix(abx: Abx) -> None:
    """The 'registries' preset's names, pinned to a documentation address as this host's
    own resolver gives them: each is refused, the detail names the address and its range,
    and the fix the operator setting that opens it; opened, the check passes."""
    names = [n for n in PRESETS["registries"] if not n.startswith("*.")]
    pinned = {"ABX_NETWORK_HOSTS": ",".join(f"{n}=203.0.113.80" for n in names)}
    report = abx("doctor", "--json", env=pinned, check=None).json()
    registries = {c["name"]: c for c in report["checks"]}["registries"]
    assert report["ok"] and not registries["ok"] and not registries["required"], registries
    assert f"{len(names)} of {len(names)} names" in registries["detail"], registries
    assert "resolves only to 203.0.113.80 (in 203.0.113.0/24)" in registries["detail"]
    assert "ABX_NETWORK_OPEN_RANGES=203.0.113.80/32" in registries["fix"], registries
    opened = abx("doctor", "--json", env={**pinned, "ABX_NETWORK_OPEN_RANGES":
                                          "203.0.113.80/32"}, check=None).json()
    assert {c["name"]: c for c in opened["checks"]}["registries"]["ok"], opened


@pytest.mark.parametrize("case", ["proc", "closed parent", "umask 077"])
def test_doctor_and_create_agree_on_the_data_dir(abx: Abx, case: str) -> None:
    """Doctor runs the engine's own start check (it tries what create does): where it
    fails, create fails before making anything, with the same fix; where it passes, a
    sandbox really runs there (directories made under a umask of 077 included)."""
    top = Path(tempfile.mkdtemp(prefix="abx-agree-", dir="/var/tmp"))
    top.chmod(0o755)
    (top / "closed").mkdir(mode=0o700)
    data = {"proc": Path("/proc/x"), "closed parent": top / "closed" / "abx",
            "umask 077": top / "new" / "deep" / "abx"}[case]
    env = {"ABX_DATA_DIR": str(data)}
    try:
        checks = {c["name"]: c for c in abx("doctor", "--json", env=env, check=None)
                  .json()["checks"]}
        old = os.umask(0o077)
        try:
            created = abx("sandbox", "create", "--json", env=env, check=None, timeout=120)
        finally:
            os.umask(old)
        if case != "umask 077":
            assert not checks["data dir"]["ok"] and checks["data dir"]["required"]
            assert created.code == 1 and checks["data dir"]["fix"] in created.err, created
            assert "runc run failed" not in created.err  # refused before any runc
            assert not data.exists()
            return
        assert checks["data dir"]["ok"], checks["data dir"]
        assert created.code == 0, created
        sandbox_id = created.json()["sandbox_id"]
        assert abx("sandbox", "exec", sandbox_id, "echo ran", env=env).out == "ran\n"
        assert oct((top / "new").stat().st_mode & 0o777) == "0o755"
        abx("sandbox", "kill", sandbox_id, "--delete-volume", env=env)
        abx("doctor", "--cleanup", env=env)
    finally:
        shutil.rmtree(top)


COMMANDS = [
    ["mcp", "install"], ["mcp", "uninstall"], ["mcp", "status"], ["mcp", "start"],
    ["mcp", "stop"], ["mcp", "deploy"], ["config", "set"], ["config", "get"],
    ["config", "list"], ["config", "unset"], ["sandbox", "create"], ["sandbox", "list"],
    ["sandbox", "info"], ["sandbox", "exec"], ["sandbox", "run-code"], ["sandbox", "upload"],
    ["sandbox", "download"], ["sandbox", "pause"], ["sandbox", "resume"], ["sandbox", "reset"],
    ["sandbox", "kill"], ["template", "list"], ["template", "build"], ["template", "remove"],
    ["doctor"],
]


def test_every_command_has_help_with_an_example(abx: Abx) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: abx(*c, "--help"), COMMANDS))
    for command, r in zip(COMMANDS, results, strict=True):
        assert "Example" in r.out, command
    assert abx("nosuch", check=2).code == 2


def test_doctor_cleanup_leaves_a_deletable_data_dir(abx: Abx) -> None:
    """The uninstall path: with a sandbox left it says so; once killed, nothing of ours
    stays mounted (the last process out releases the template views by itself too) and
    the data dir deletes cleanly."""
    data = Path(tempfile.mkdtemp(prefix="abx-cleanup-", dir="/var/tmp"))
    env = {"ABX_DATA_DIR": str(data)}
    sandbox_id = abx("sandbox", "create", "--json", env=env).json()["sandbox_id"]
    busy = abx("doctor", "--cleanup", env=env, check=1)
    assert sandbox_id in busy.out and "kill" in busy.out
    abx("sandbox", "kill", sandbox_id, "--delete-volume", env=env)
    assert mounts_under(data) == []  # the CLI's own exit released the views
    report = abx("doctor", "--cleanup", "--json", env=env).json()
    assert report["ok"] and report["sandboxes"] == [] and report["mounts_left"] == []
    assert not supervisor.status(data).running  # nothing of ours runs for this data dir
    shutil.rmtree(data)  # no read-only view to walk into
