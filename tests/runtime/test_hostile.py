"""Hostile code inside a sandbox: every attack here runs in the sandbox, and every one
must leave the host untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from syscall_prelude import PRELUDE

from agent_sandbox import Sandbox
from agent_sandbox.core.models import CommandResult

pytestmark = pytest.mark.integration

HOST_ID_BASE = 100000
MB = 1024 * 1024
# Capability bits that must never be effective inside.
CAP_NET_RAW, CAP_SYS_MODULE, CAP_SYS_PTRACE, CAP_SYS_ADMIN = 13, 16, 19, 21

x86_64_only = pytest.mark.skipif(platform.machine() != "x86_64",
                                 reason="raw syscall numbers below are x86_64's")

_PY = PRELUDE  # raw syscalls that report -errno (tests/syscall_prelude.py)


def run(sb: Sandbox, cmd: str, timeout: float = 20, **kw: object) -> CommandResult:
    return sb.commands.run(cmd, timeout=timeout, **kw)


def py(sb: Sandbox, code: str, timeout: float = 20) -> dict:
    """Run python code inside; it prints one JSON document, returned decoded."""
    res = sb.commands.run("python3 -", stdin=_PY + code, timeout=timeout)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def container_pid(sb: Sandbox) -> int:
    runc_root = Path(os.environ["ABX_DATA_DIR"]) / "runc"
    out = subprocess.run(["runc", "--root", str(runc_root), "state", sb.sandbox_id],
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)["pid"])


def host_ids(pid: int) -> tuple[list[int], list[int]]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = [int(v) for v in value.split()] if key in ("Uid", "Gid") else value
    return fields["Uid"], fields["Gid"]


def host_ipv4s() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    return [m.group(1) for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
            if not m.group(1).startswith("127.")]


@contextlib.contextmanager
def host_file(path: Path, content: str, mode: int = 0o600) -> Iterator[Path]:
    assert not path.exists(), path
    try:
        path.write_text(content)
        os.chmod(path, mode)
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def tag() -> str:
    return "abx-hostile-" + secrets.token_hex(6)


def _sanitized_shadow(text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln]
    # '*' for the host's accounts (hashes masked), '!' for the sandbox's own `user` (locked).
    return bool(lines) and all(ln.split(":")[1] in ("*", "!") for ln in lines)


def _host_hashes() -> list[str]:
    """Real password hashes in the host's /etc/shadow (often none on a server)."""
    try:
        lines = Path("/etc/shadow").read_text().splitlines()
    except OSError:
        return []
    return [p[1] for p in (ln.split(":") for ln in lines)
            if len(p) > 2 and p[1] not in ("", "*", "!", "!*", "!!", "x")]


# 1 -------------------------------------------------------------------------------------
def test_host_root_canary_unreachable(sandbox: Sandbox, tag: str) -> None:
    secret = secrets.token_hex(16)
    with host_file(Path("/root") / tag, secret):
        res = run(sandbox, f"""
            ls -A /root; echo ---
            for p in /root/{tag} /proc/1/root/root/{tag} /proc/self/root/root/{tag} \\
                     /workspace/../../../../root/{tag} /proc/1/cwd/../../root/{tag} \\
                     /.abx/run/../../../../../root/{tag} /.abx/guest/../../../root/{tag}; do
                cat "$p" 2>/dev/null && echo "READ $p"
            done
            find / -xdev -name '{tag}' 2>/dev/null
            echo done""")
        assert res.exit_code == 0, res.stderr
        assert secret not in res.stdout and "READ" not in res.stdout
        assert res.stdout.split("---")[0].strip() == ""  # /root inside is fresh and empty
        assert tag not in res.stdout
        for path in (f"/root/{tag}", f"/proc/1/root/root/{tag}",
                     f"/workspace/../../../../root/{tag}"):
            assert not sandbox.files.exists(path)
            with pytest.raises(Exception):  # noqa: B017 - any not-found error will do
                sandbox.files.read(path)


# 2 -------------------------------------------------------------------------------------
def test_writes_to_usr_and_etc_stay_in_sandbox(sandbox: Sandbox, tag: str) -> None:
    targets = [f"/usr/local/{tag}", f"/usr/bin/{tag}", f"/etc/{tag}"]
    env_before = Path("/usr/bin/env").read_bytes()
    res = run(sandbox, "; ".join(f"echo x > {t} && cat {t}" for t in targets)
              + "; echo '#x' >> /usr/bin/env && tail -c 3 /usr/bin/env")
    assert res.exit_code == 0 and res.stdout == "x\nx\nx\n#x\n", res
    for t in targets:
        assert not Path(t).exists(), f"{t} appeared on the host"
    assert Path("/usr/bin/env").read_bytes() == env_before


# 3 -------------------------------------------------------------------------------------
def test_host_processes_invisible(sandbox: Sandbox) -> None:
    me = os.getpid()
    ps = run(sandbox, "ps -eo pid=,args=").stdout
    pids = run(sandbox, "ls /proc | grep -E '^[0-9]+$'").stdout
    mine = run(sandbox, f"cat /proc/{me}/cmdline 2>&1").stdout
    init = run(sandbox, "cat /proc/1/cmdline").stdout
    inside = {int(p) for p in pids.split()}
    assert len(inside) < 10, inside  # the guest, this shell and its children
    assert "pytest" not in ps and "pytest" not in mine
    assert "runc" not in ps and "sshd" not in ps
    assert "agent" in init.replace("\0", " ")  # pid 1 is the guest agent
    assert me not in inside or "pytest" not in mine


# 4 -------------------------------------------------------------------------------------
def test_cannot_signal_host_process(sandbox: Sandbox) -> None:
    victim = subprocess.Popen(["sleep", "1000"])
    try:
        res = run(sandbox, f"kill -9 {victim.pid}; echo rc=$?; "
                           f"python3 -c 'import os; os.kill({victim.pid}, 9)'; echo rc=$?")
        assert "rc=0" not in res.stdout
        assert "No such process" in res.stderr or "ProcessLookupError" in res.stderr
        run(sandbox, "kill -9 -1; echo survived")  # every process it may signal
        time.sleep(0.2)
        assert victim.poll() is None, "a host process died"
        assert run(sandbox, "echo ok").stdout == "ok\n"  # the guest shrugged it off
    finally:
        victim.kill()
        victim.wait()


# 5 -------------------------------------------------------------------------------------
def test_no_mount_no_namespaces(sandbox: Sandbox) -> None:
    res = run(sandbox, "mount -t tmpfs x /mnt; echo rc=$?; "
                       "mount --bind /workspace /mnt; echo rc=$?; "
                       "unshare -U true; echo rc=$?; unshare -Ur true; echo rc=$?; "
                       "unshare -m true; echo rc=$?; unshare -n true; echo rc=$?; "
                       "unshare -p -f true; echo rc=$?; grep -c ' /mnt ' /proc/mounts")
    codes = re.findall(r"rc=(\d+)", res.stdout)
    assert len(codes) == 7 and "0" not in codes, res
    assert res.stdout.strip().endswith("0")  # nothing got mounted


@x86_64_only
def test_ptrace_reaches_nothing_outside(sandbox: Sandbox) -> None:
    victim = subprocess.Popen(["sleep", "1000"])
    try:
        out = py(sandbox, f"""
import json, subprocess, time
res = {{"host": pt(PTRACE_ATTACH, {victim.pid}), "init": pt(PTRACE_ATTACH, 1)}}
if res["init"] == 0:  # never leave the guest stopped
    os.waitpid(1, 0); pt(PTRACE_DETACH, 1)
res["init_seize"] = pt(PTRACE_SEIZE, 1)
res["init_seize_hi"] = sc(101, PTRACE_SEIZE, (1 << 32) | 1, 0, 0)  # garbage high bits
res["vm_write_init"] = sc(311, 1, 0, 0, 0, 0, 0)  # process_vm_writev
child = subprocess.Popen(["sleep", "30"])
res["child"] = pt(PTRACE_ATTACH, child.pid)  # debugging inside the sandbox still works
if res["child"] == 0:
    os.waitpid(child.pid, 0); pt(PTRACE_DETACH, child.pid)
child.kill()
print(json.dumps(res))
""")
        assert out["host"] == -3  # ESRCH: host pids do not exist in here
        assert out["init"] == out["init_seize"] == out["init_seize_hi"] == -1  # EPERM
        assert out["vm_write_init"] == -1
        assert out["child"] == 0
        assert victim.poll() is None
        assert Path(f"/proc/{victim.pid}/status").read_text().count("TracerPid:\t0") == 1
    finally:
        victim.kill()
        victim.wait()


# 6 -------------------------------------------------------------------------------------
@x86_64_only
def test_kernel_and_host_facing_syscalls_refused(sandbox: Sandbox) -> None:
    modules = Path("/proc/modules")  # absent on a kernel built without modules
    modules_before = modules.read_text() if modules.exists() else ""
    out = py(sandbox, """
import json, socket
res = {
    "init_module": sc(175, None, 0, b""), "finit_module": sc(313, 0, b"", 0),
    "delete_module": sc(176, b"loop", 0), "kexec_load": sc(246, 0, 0, None, 0),
    "bpf": sc(321, 0, None, 0), "perf_event_open": sc(298, None, 0, -1, -1, 0),
    "keyctl": sc(250, 0, 0, 0, 0, 0), "io_uring_setup": sc(425, 1, None),
    "open_by_handle_at": sc(304, 0, None, 0), "setns": sc(308, 0, 0),
    "unshare_userns": sc(272, 0x10000000), "mount": sc(165, b"x", b"/mnt", b"tmpfs", 0, None),
    "pidfd_getfd": sc(438, 0, 1, 0), "syslog": sc(103, 3, None, 0),
}
try:
    socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK: not confined by the netns
    res["vsock"] = 0
except OSError as e:
    res["vsock"] = -e.errno
print(json.dumps(res))
""")
    assert all(v == -1 for v in out.values()), out  # EPERM everywhere
    res = run(sandbox, "for t in insmod modprobe rmmod; do command -v $t >/dev/null && "
                       "$t loop; done; echo end")
    assert "end" in res.stdout
    assert (modules.read_text() if modules.exists() else "") == modules_before


@x86_64_only
def test_guest_descriptors_cannot_be_stolen(sandbox: Sandbox) -> None:
    """pid 1's descriptors (its listener from the host, its stdio) stay its own."""
    out = py(sandbox, """
import json
pidfd = sc(434, 1, 0)
fd = sc(438, pidfd, 1, 0) if pidfd >= 0 else pidfd
if fd >= 0:
    os.write(fd, b"stolen\\n")
try:
    open("/proc/1/fd/1", "ab").write(b"reopened\\n")
    reopen = 0
except OSError as e:
    reopen = -e.errno
print(json.dumps({"getfd": fd, "reopen": reopen}))
""")
    assert out["getfd"] == -1  # EPERM: seccomp
    assert out["reopen"] < 0
    pid = container_pid(sandbox)
    assert os.readlink(f"/proc/{pid}/fd/1") == "/dev/null"  # nothing of the host's disk


# 7 -------------------------------------------------------------------------------------
def test_host_network_unreachable(sandbox: Sandbox, tag: str) -> None:
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))  # the host's loopback and every host address
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + tag)
    abstract.listen(1)
    targets = ["127.0.0.1", *host_ipv4s()]
    try:
        out = py(sandbox, f"""
import json, socket
res = {{}}
for host in {targets!r}:
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, {port})); res[host] = 0
    except OSError as e:
        res[host] = e.errno or -1
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\\0{tag}"); res["abstract"] = 0
except OSError as e:
    res["abstract"] = e.errno
print(json.dumps(res))
""")
        assert out.pop("127.0.0.1") == 111  # ECONNREFUSED: its own loopback
        assert out.pop("abstract") == 111  # abstract unix sockets are per netns too
        for host, err in out.items():
            assert err == 101, f"{host}: errno {err}"  # ENETUNREACH: no route at all
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
        abstract.close()


# 8 -------------------------------------------------------------------------------------
def test_escape_via_proc_and_symlinks(sandbox: Sandbox, tag: str) -> None:
    res = run(sandbox, "ln -s /etc/shadow /workspace/s && ln -s / /workspace/hostroot && "
                       "readlink /proc/self/exe && cat /etc/shadow")
    assert res.exit_code == 0, res
    exe, shadow = res.stdout.split("\n", 1)
    assert exe == "/usr/bin/readlink"
    # pid 1 (the guest) is not dumpable: its exe, root and fds are closed to the sandbox.
    for probe in ("readlink -v /proc/1/exe", "ls /proc/1/root/", "readlink -v /proc/1/fd/1"):
        denied = run(sandbox, probe)
        assert denied.exit_code != 0 and "Permission denied" in denied.stderr, (probe, denied)
    for text in (shadow, sandbox.files.read("/workspace/s"),
                 sandbox.files.read("/workspace/hostroot/etc/shadow"),
                 sandbox.files.read("/proc/1/root/etc/shadow")):
        assert _sanitized_shadow(text)
        assert not any(h in text for h in _host_hashes())
    sandbox.files.write(f"/workspace/hostroot/usr/local/{tag}", "through a symlink")
    assert sandbox.files.read(f"/usr/local/{tag}") == "through a symlink"
    assert not Path(f"/usr/local/{tag}").exists()
    # /proc/self/exe of the host's python, re-opened for writing from inside: refused
    # (text busy or read-only lower), and the host binary is unchanged either way.
    before = Path("/usr/bin/python3").stat()
    run(sandbox, "python3 -c \"open('/proc/self/exe', 'ab').write(b'x')\"")
    after = Path("/usr/bin/python3").stat()
    assert (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns)


# 9 -------------------------------------------------------------------------------------
def test_file_api_traversal(sandbox: Sandbox, tag: str) -> None:
    assert _sanitized_shadow(sandbox.files.read("/workspace/../../../../etc/shadow"))
    # ".." above / stays at / (as in any path walk): the sandbox's own /root, never the host's.
    sandbox.files.write(f"/../../root/{tag}", "x")
    assert sandbox.files.read(f"/root/{tag}") == "x"
    sandbox.files.write(f"/workspace/../../../usr/local/{tag}", "y")
    assert not Path(f"/root/{tag}").exists()
    assert not Path(f"/usr/local/{tag}").exists()
    names = {e.name for e in sandbox.files.list("/workspace/../../../../root")}
    assert names <= {tag}


# 10 ------------------------------------------------------------------------------------
_FORK_LOOP = """
import json, time
made, err = 0, None
while made < 5000:  # bounded: the pids limit (512) stops it long before
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    made += 1
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print(json.dumps({"made": made, "errno": err}))
"""


@pytest.mark.slow
def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    cg = Path("/sys/fs/cgroup/pids/abx") / sandbox.sandbox_id
    out = py(sandbox, _FORK_LOOP, timeout=30)
    assert out["errno"] == 11 and out["made"] < 512, out  # EAGAIN at the pids limit
    # The classic: timeout kills its whole process group, bomb included.
    sandbox.commands.run("timeout -s KILL 6 sh -c 'b(){ b|b& }; b'", background=True)
    time.sleep(2)
    start = time.monotonic()
    subprocess.run(["true"], check=True)  # the host still forks and runs promptly
    assert time.monotonic() - start < 2
    if cg.exists():
        assert int((cg / "pids.current").read_text()) <= 512
    # No guest call while it rages: the guest, too, needs pids for its threads.
    time.sleep(max(0.0, start + 5 - time.monotonic()))
    deadline = time.monotonic() + 20
    while True:  # usable again once timeout killed the bomb and its zombies are reaped
        try:
            count = run(sandbox, "ls /proc | grep -cE '^[0-9]+$'", timeout=5).stdout
            if count.strip().isdigit() and int(count) < 10:
                break
        except Exception:  # noqa: BLE001 - the guest may not get a pid for a moment
            pass
        assert time.monotonic() < deadline, "sandbox unusable after the fork bomb"
        time.sleep(0.5)
    assert run(sandbox, "echo ok").stdout == "ok\n"


# 11 ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_memory_bomb_kills_only_the_offender() -> None:
    with Sandbox.create(memory_mb=128) as sb:
        res = run(sb, "python3 -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * (1 << 18)'",
                  timeout=60)
        assert res.exit_code == 137 or "MemoryError" in res.stderr, res
        assert run(sb, "echo ok").stdout == "ok\n"
        guest = run(sb, "cat /proc/1/cmdline").stdout  # the guest, not rebooted
        assert "/.abx/hostusr/bin/python3" in guest and "--listen-fd" in guest, guest


# 12 ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_disk_fill_is_contained() -> None:
    data = os.environ["ABX_DATA_DIR"]
    with Sandbox.create(disk_mb=64) as sb:
        # The host's own free space would count the other tests' writes too: the image's
        # blocks on the host are what the sandbox can take.
        image = Path(data) / "volumes" / f"{sb.info().volume_id}.img"
        for where in ("/workspace/big", "/var/tmp/big", "/tmp/big", "/root/big"):
            res = run(sb, f"dd if=/dev/zero of={where} bs=1M count=200", timeout=60)
            assert res.exit_code != 0 and "No space left on device" in res.stderr, (where, res)
            assert image.stat().st_blocks * 512 <= 65 * MB and image.stat().st_size == 64 * MB
            run(sb, f"rm -f {where}")
        assert run(sb, "dd if=/dev/zero of=/workspace/ok bs=1M count=8 && echo ok").exit_code == 0
        assert sb.files.read("/workspace/ok", format="bytes") == bytes(8 * MB)


@pytest.mark.slow
def test_disk_fill_via_guest_run_dir() -> None:
    data = os.environ["ABX_DATA_DIR"]
    with Sandbox.create(disk_mb=64) as sb:
        free = shutil.disk_usage(data).free
        try:
            res = run(sb, "dd if=/dev/zero of=/.abx/run/big bs=1M count=96", timeout=60)
            grown = free - shutil.disk_usage(data).free
        finally:
            run(sb, "rm -f /.abx/run/big")
        assert res.exit_code != 0 and "No space left on device" in res.stderr
        assert grown < 70 * MB


def assert_guest_not_hijackable(sandbox: Sandbox) -> None:
    """No sandbox process may ptrace the guest's threads or write its memory."""
    out = py(sandbox, """
import json
tids = [int(t) for t in os.listdir("/proc/1/task") if t != "1"]
res = {"threads": [pt(PTRACE_SEIZE, t) for t in tids]}  # a seized tracee is not stopped
try:
    os.close(os.open("/proc/1/mem", os.O_RDWR)); res["mem"] = 0
except OSError as e:
    res["mem"] = -e.errno
print(json.dumps(res))
""")
    assert all(r < 0 for r in out["threads"]), out
    assert out["mem"] < 0, out


def test_guest_cannot_be_hijacked(sandbox: Sandbox) -> None:
    pid = container_pid(sandbox)
    data_dev = os.stat(os.environ["ABX_DATA_DIR"]).st_dev
    assert_guest_not_hijackable(sandbox)
    for fd in os.listdir(f"/proc/{pid}/fd"):
        st = os.stat(f"/proc/{pid}/fd/{fd}")
        assert not (stat.S_ISREG(st.st_mode) and st.st_dev == data_dev), \
            f"guest fd {fd} is a file on the host's disk"


# 13 ------------------------------------------------------------------------------------
def test_host_secrets_hidden(sandbox: Sandbox) -> None:
    res = run(sandbox, "cat /etc/shadow; echo ---; cat /etc/gshadow 2>/dev/null; echo ---; "
                       "ls -A /home /root; echo ---; ls /etc/ssh 2>/dev/null; echo ---; "
                       "cat /etc/machine-id 2>&1")
    shadow, gshadow, homes, ssh, machine_id = res.stdout.split("---")
    assert _sanitized_shadow(shadow)
    assert not gshadow.strip() or _sanitized_shadow(gshadow)
    assert homes.split() == ["/home:", "/root:"]
    host_keys = sorted(p.name for p in Path("/etc/ssh").glob("ssh_host_*_key"))
    for name in host_keys:
        assert name not in ssh.split()
        inside = run(sandbox, f"cat /etc/ssh/{name}")
        assert inside.exit_code != 0 and "PRIVATE KEY" not in inside.stdout
    if Path("/etc/machine-id").exists():
        assert Path("/etc/machine-id").read_text().strip() not in machine_id


def test_host_secret_created_later_hidden(sandbox: Sandbox, tag: str) -> None:
    secret = secrets.token_hex(16)
    with host_file(Path("/etc") / tag, secret, mode=0o600):
        running = run(sandbox, f"cat /etc/{tag}")
        with Sandbox.create() as fresh:
            new = run(fresh, f"cat /etc/{tag}")
    assert secret not in running.stdout
    assert secret not in new.stdout


# 14 ------------------------------------------------------------------------------------
def test_capabilities_nonewprivs_seccomp(sandbox: Sandbox) -> None:
    status = dict(line.split(":\t", 1) for line in
                  run(sandbox, "cat /proc/self/status").stdout.splitlines() if ":\t" in line)
    for key in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"):
        caps = int(status[key], 16)
        for bit in (CAP_SYS_ADMIN, CAP_NET_RAW, CAP_SYS_MODULE, CAP_SYS_PTRACE):
            assert not caps >> bit & 1, f"{key} has capability {bit}"
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    # And a setuid binary does not get past no_new_privs.
    res = run(sandbox, "cp /usr/bin/id /tmp/id && chmod u+s /tmp/id && "
                       "setpriv --reuid=65534 --regid=65534 --clear-groups /tmp/id -u")
    assert res.stdout.strip() == "65534", res


# 15 ------------------------------------------------------------------------------------
def test_sandbox_runs_as_unprivileged_host_uid(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    try:
        pid1 = container_pid(sandbox)
        assert host_ids(pid1) == ([HOST_ID_BASE] * 4, [HOST_ID_BASE] * 4)
        procs = Path("/sys/fs/cgroup/pids/abx") / sandbox.sandbox_id / "cgroup.procs"
        pids = [int(p) for p in procs.read_text().split()] if procs.exists() else [pid1]
        assert len(pids) >= 2 or not procs.exists()
        for pid in pids:
            uids, gids = host_ids(pid)
            assert all(HOST_ID_BASE <= u < HOST_ID_BASE + 65536 for u in uids + gids), pid
        assert Path(f"/proc/{pid1}/uid_map").read_text().split() == ["0", "100000", "65536"]
    finally:
        handle.kill()


# 16 ------------------------------------------------------------------------------------
def test_two_sandboxes_isolated(sandbox: Sandbox, tag: str) -> None:
    sandbox.files.write(f"/workspace/{tag}", "one")
    run(sandbox, f"echo one > /tmp/{tag}; echo one > /usr/local/{tag}")
    handle = sandbox.commands.run(f"exec python3 -c 'import time; time.sleep(60)' {tag}",
                                  background=True)
    with Sandbox.create() as other:
        pattern = tag.replace("-", "[-]")  # matches the tag, not this command line
        listing = run(other, f"ls /workspace /tmp /usr/local; find / -xdev -name '{pattern}'")
        assert tag not in listing.stdout
        assert tag not in run(other, "ps -eo args").stdout
        assert run(other, f"pkill -9 -f '{pattern}'").exit_code == 1  # nothing over there
        assert not other.files.exists(f"/workspace/{tag}")
        other_pid = container_pid(other)
        res = run(sandbox, f"kill -0 {other_pid}; ls /proc/{other_pid}/root 2>&1; echo end")
        assert "end" in res.stdout and "workspace" not in res.stdout
    assert tag in run(sandbox, "ps -eo args").stdout  # still alive in its own sandbox
    handle.kill()
