"""The hostile battery (test_hostile.py and the modules in HOSTILE), run by an
unprivileged user against rootless sandboxes (``test_rootless.py`` starts this script as that user).

Every attack of test_hostile.py runs as it is, each against a fresh sandbox, except the
few whose setup or assertion is about the root engine; those are replaced by rootless
equivalents below or skipped with the reason. Prints one JSON object: name -> "ok",
"skip: why" or "fail: traceback".

Usage: python rootless_battery.py NAME... (env ABX_CANARIES: JSON {path: secret} of host
files the sandboxes must not read, made beforehand by root).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_sandbox.config.engine import default_data_dir

os.environ.setdefault("ABX_DATA_DIR", str(default_data_dir()))  # test_hostile reads it
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # netprobe, as conftest has it
os.environ.update(__import__("netprobe").ENV)

import test_hostile as h  # noqa: E402
import test_hostile_host  # noqa: E402
import test_hostile_kernels  # noqa: E402
import test_hostile_network  # noqa: E402
import test_hostile_ports  # noqa: E402
import test_state_files  # noqa: E402
import test_tmpfs_caps  # noqa: E402

from agent_sandbox import Sandbox  # noqa: E402
from agent_sandbox.providers.local import local_provider  # noqa: E402

SKIPPED = {
    "test_disk_fill_is_contained": "rootless sandboxes have no disk limit (no loop devices "
                                   "or quotas without root; documented, doctor says so)",
    "test_disk_fill_via_guest_run_dir": "rootless: the run dir is a plain directory, no "
                                        "tmpfs size limit without root (no disk limit)",
    "test_host_secret_created_later_hidden": "writes the host's /etc; covered by "
                                             "rootless_canaries (root-made /etc file)",
}
REPLACED = {
    "test_host_root_canary_unreachable": "rootless_canaries",
    "test_sandbox_runs_as_unprivileged_host_uid": "rootless_runs_as_the_user",
    "test_guest_cannot_be_hijacked": "rootless_guest_cannot_be_hijacked",
}


# rootless equivalents ---------------------------------------------------------------------
def rootless_canaries(sandbox: Sandbox) -> None:
    """Host files (the user's own home, /root, a root-only /etc file) are not readable."""
    canaries = json.loads(os.environ["ABX_CANARIES"])
    for path, secret in canaries.items():
        name = Path(path).name
        probes = " ".join(f"'{p}'" for p in (
            path, f"/proc/1/root{path}", f"/proc/self/root{path}",
            f"/workspace/../../../..{path}", f"/.abx/guest/../../..{path}",
            f"/.abx/run/../../../../..{path}"))
        res = sandbox.commands.run(f"for p in {probes}; do cat \"$p\" 2>/dev/null && "
                                   f"echo READ; done; find / -xdev -name '{name}' "
                                   "2>/dev/null; echo done", timeout=60)
        assert res.exit_code == 0, res
        assert secret not in res.stdout and "READ" not in res.stdout, (path, res.stdout)
        assert name not in res.stdout, (path, res.stdout)
        assert not sandbox.files.exists(path)
    home = Path.home()
    listing = sandbox.commands.run(f"ls -A {home} /home /root 2>&1; echo end").stdout
    assert home.name not in listing.replace(str(home), ""), listing


def rootless_runs_as_the_user(sandbox: Sandbox) -> None:
    """pid 1 is the user's own uid on the host; other ids inside are its subuids."""
    handle = sandbox.commands.run("exec setpriv --reuid=65534 --regid=65534 --clear-groups "
                                  "sleep 30", background=True)
    try:
        pid1 = h.container_pid(sandbox)
        uid, gid = os.getuid(), os.getgid()
        assert h.host_ids(pid1) == ([uid] * 4, [gid] * 4)
        uid_map = Path(f"/proc/{pid1}/uid_map").read_text().split()
        assert uid_map[:3] == ["0", str(uid), "1"], uid_map
        sub = _subuid_start()
        if sub is not None:
            assert uid_map[3:] == ["1", str(sub), "65535"], uid_map
            child = _find_child(pid1, "sleep")
            assert child is not None
            assert h.host_ids(child)[0] == [sub + 65533] * 4  # 65534 inside
    finally:
        handle.kill()


def rootless_guest_cannot_be_hijacked(sandbox: Sandbox) -> None:
    """test_guest_cannot_be_hijacked's attacks; its last assertion (the guest's stdout is
    not a file on the host's disk) is about the disk limit rootless has not got."""
    h.assert_guest_not_hijackable(sandbox)


def rootless_no_network_by_default(sandbox: Sandbox) -> None:
    res = sandbox.commands.run("cat /proc/net/dev; cat /proc/net/route")
    ifaces = re.findall(r"^\s*(\w+):", res.stdout, re.M)
    assert ifaces == ["lo"], res.stdout
    assert len(res.stdout.split("Iface")[1].strip().splitlines()) == 1  # header only


def rootless_limits(sandbox: Sandbox) -> None:
    """What info() reports is what holds: RLIMIT_NPROC stops a fork bomb (in the battery
    too), RLIMIT_AS a big allocation, RLIMIT_FSIZE a big file; cgroups are not claimed."""
    engine = local_provider()
    about = engine.engine_info()
    assert about["mode"] == "rootless", about
    with Sandbox.create(memory_mb=96, disk_mb=20) as sb:
        enforced = sb.info().enforced
        assert enforced["memory_per_process"] and enforced["pids_per_uid"], enforced
        assert enforced["file_size"] and not enforced["disk"], enforced
        if not about["limits"]["memory"].startswith("cgroup"):
            assert not enforced["memory"] and not enforced["pids"], enforced
        table = sb.commands.run("cat /proc/self/limits").stdout
        hard = {name: table.split(name, 1)[1].split()[1] for name in
                ("Max address space", "Max processes", "Max file size")}
        assert hard == {"Max address space": str(96 << 20), "Max processes": "512",
                        "Max file size": str(20 << 20)}, table
        # The guest (pid 1) is not under the address-space limit: its threads need more.
        guest = sb.commands.run("cat /proc/1/limits").stdout
        assert guest.split("Max address space", 1)[1].split()[1] == "unlimited", guest
        big = sb.commands.run("python3 -c 'b = bytearray(200 << 20)'", timeout=30)
        assert big.exit_code != 0 and "MemoryError" in big.stderr, big
        small = sb.commands.run("python3 -c 'b = bytearray(16 << 20); print(len(b))'")
        assert small.stdout.strip() == str(16 << 20), small
        dd = sb.commands.run("dd if=/dev/zero of=/workspace/f bs=1M count=30", timeout=30)
        # EFBIG, or SIGXFSZ (128 + 25) where the writer does not ignore the signal
        assert dd.exit_code == 153 or "File too large" in dd.stderr, dd
        assert sb.commands.run("stat -c %s /workspace/f").stdout == f"{20 << 20}\n"
        out = h.py(sb, h._FORK_LOOP, timeout=30)
        assert out["errno"] == 11 and out["made"] < 512, out  # EAGAIN at RLIMIT_NPROC
        assert sb.commands.run("echo ok").stdout == "ok\n"


EXTRA = {f.__name__: f for f in (rootless_canaries, rootless_runs_as_the_user,
                                 rootless_guest_cannot_be_hijacked,
                                 rootless_no_network_by_default,
                                 rootless_limits)}


# Every module of in-sandbox attacks, run as the user (the kernel attacks skip if the
# user's code-interpreter template is not built; test_rootless.py's run_code test builds it).
HOSTILE = (h, test_hostile_host, test_hostile_kernels, test_hostile_network, test_hostile_ports,
           test_state_files, test_tmpfs_caps)


def _attack(name: str) -> Callable[..., None]:
    return next(getattr(m, name) for m in HOSTILE if hasattr(m, name))


def names() -> list[str]:
    return sorted(n for m in HOSTILE for n in dir(m) if n.startswith("test_")) + sorted(EXTRA)


# helpers ---------------------------------------------------------------------------------
def _subuid_start() -> int | None:
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    for line in Path("/etc/subuid").read_text().splitlines():
        parts = line.split(":")
        if len(parts) == 3 and parts[0] in (me, str(os.getuid())):
            return int(parts[1])
    return None


def _find_child(root: int, comm: str, wait: float = 10.0) -> int | None:
    """A descendant of ``root`` named ``comm``, waited for: a background command is
    still its shell or setpriv for a moment before it execs."""
    deadline = time.monotonic() + wait
    while True:
        todo = [root]
        while todo:
            pid = todo.pop()
            for children in Path(f"/proc/{pid}/task").glob("*/children"):  # every thread's
                try:
                    found = [int(c) for c in children.read_text().split()]
                except OSError:
                    continue
                for child in found:
                    try:
                        if Path(f"/proc/{child}/comm").read_text().strip() == comm:
                            return child
                    except OSError:
                        continue
                    todo.append(child)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _call(fn: Callable[..., None]) -> None:
    params = inspect.signature(fn).parameters
    kwargs: dict[str, object] = {}
    if "tag" in params:
        kwargs["tag"] = "abx-hostile-" + secrets.token_hex(6)
    if "tmp_path" in params and "sandbox" not in params:  # pytest's scratch-dir fixture
        scratch = tempfile.mkdtemp(prefix="abx-battery-")
        try:
            fn(**kwargs, tmp_path=Path(scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    if "sandbox" not in params:
        fn(**kwargs)
        return
    sb = Sandbox.create()
    try:
        fn(sandbox=sb, **kwargs)
    finally:
        try:
            sb.kill(delete_volume=True)
        except Exception:  # noqa: BLE001 - an attack may have ended it
            pass


def run(name: str) -> str:
    if name in SKIPPED:
        return f"skip: {SKIPPED[name]}"
    fn = EXTRA.get(REPLACED.get(name, name)) or _attack(name)
    try:
        _call(fn)
        return "ok"
    except pytest.skip.Exception as exc:
        return f"skip: {exc.msg}"
    except BaseException:  # noqa: BLE001 - reported, the battery goes on
        return "fail: " + traceback.format_exc()[-3000:]


def main() -> None:
    wanted = sys.argv[1:] or names()
    results = {name: run(name) for name in wanted}
    engine = local_provider()
    for info in engine.list():
        engine.kill(info.sandbox_id, delete_volume=True)
    for volume in engine.list_volumes():
        engine.delete_volume(volume.volume_id)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
