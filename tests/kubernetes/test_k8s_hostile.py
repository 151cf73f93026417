"""The hostile battery's in-sandbox attacks (tests/runtime/test_hostile.py), run inside Pod
sandboxes of the Kubernetes provider on the test cluster: each must stay in its Pod.

A Pod has no user namespace: root in it is uid 0 of the node, held by its dropped
capabilities, NoNewPrivs and the runtime's default seccomp profile; the kubelet's cgroups
bound its memory, CPU and node disk (ephemeral-storage). What the test cluster cannot
contain the way a production cluster would is asserted as far as it is true, and said:

- egress: the bridge CNI stores NetworkPolicies but does not enforce them, so only the
  policy objects are checked here (an "off" sandbox's policy denies all egress; "full"
  excludes the private ranges, pod networks included);
- pids: a fork bomb is capped by the kubelet's podPidsLimit (scripts/k8s/node.sh sets
  1024 from the cluster's next ``up``); while a node's kubelet runs without it, only the
  bounded fork loop runs, and the unbounded bomb skips (it would exhaust the host's pids)
  (the bombs are test_k8s_hostile_bombs.py's);
- routes: a Pod of the test cluster reaches only its own node's pod subnet, so the
  attack on another sandbox's guest is made between two Pods of one node;
- /workspace: a hostPath PersistentVolume of the test cluster has no quota (a storage
  class's volumes do); the Pod's own writes to its root are capped (ephemeral-storage);
- containerd 1.6's RuntimeDefault seccomp profile still allows io_uring_setup and
  AF_VSOCK sockets (the embedded engine refuses both; newer runtimes' defaults refuse
  io_uring), and on cgroup v1 a Pod has no cgroup namespace: neither is asserted here.
Hostile answers from a guest are tests/runtime/test_guest_client_hostile.py's.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8spods import guest_token, provider_env, py, quiet_kill, running_pod

from agent_sandbox import Sandbox
from agent_sandbox.backends.kubernetes import objects

pytestmark = pytest.mark.integration

# Capability bits that must never be held inside a Pod sandbox.
FORBIDDEN_CAPS = {"NET_ADMIN": 12, "NET_RAW": 13, "SYS_MODULE": 16, "SYS_RAWIO": 17,
                  "SYS_PTRACE": 19, "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_TIME": 25,
                  "MKNOD": 27, "DAC_READ_SEARCH": 2, "SYSLOG": 34, "BPF": 39}
EPERM, ENOENT, EACCES, EROFS = 1, 2, 13, 30
x86_64_only = pytest.mark.skipif(platform.machine() != "x86_64",
                                 reason="raw syscall numbers below are x86_64's")


@pytest.fixture(scope="module")
def cluster(k8s_cluster: Any) -> Iterator[Any]:
    with provider_env(k8s_cluster):
        yield k8s_cluster


@pytest.fixture(scope="module")
def fleet(cluster: Any) -> Iterator[list[Sandbox]]:
    """Sandboxes shared by this module: [0] the attacker, [1] its bystander; more are
    added by _same_node_pair."""
    made: list[Sandbox] = []
    try:
        made.extend(Sandbox.create(timeout=1800) for _ in range(2))
        yield made
    finally:
        for sb in made:
            quiet_kill(sb)


@pytest.fixture
def tag() -> str:
    return "abx-k8s-hostile-" + secrets.token_hex(6)


# privileges ----------------------------------------------------------------------------
def test_capabilities_nonewprivs_seccomp(fleet: list[Sandbox]) -> None:
    out = py(fleet[0], """
def status(pid):
    return dict(l.split(":\\t", 1) for l in open(f"/proc/{pid}/status").read().splitlines()
                if ":\\t" in l)
print(json.dumps({"self": status("self"), "guest": status(1), "uid": os.getuid()}))
""")
    assert out["uid"] == 0  # root of the node, held only by what follows
    for who in ("self", "guest"):
        status = out[who]
        for key in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"):
            caps = int(status[key], 16)
            held = [name for name, bit in FORBIDDEN_CAPS.items() if caps >> bit & 1]
            assert not held, f"{who}: {key} holds {held}"
        assert status["NoNewPrivs"].strip() == "1", who
        assert status["Seccomp"].strip() == "2", who


@x86_64_only
def test_kernel_and_namespace_syscalls_refused(fleet: list[Sandbox]) -> None:
    out = py(fleet[0], """
res = {
    "mount": sc(165, b"x", b"/mnt", b"tmpfs", 0, None),
    "mount_bind": sc(165, b"/workspace", b"/mnt", None, 4096, None),
    "umount_hosts": sc(166, b"/etc/hosts", 0),
    "fsopen": sc(430, b"tmpfs", 0), "open_tree": sc(428, -100, b"/", 1),
    "unshare_user": sc(272, 0x10000000), "unshare_mnt": sc(272, 0x20000),
    "unshare_net": sc(272, 0x40000000), "unshare_pid": sc(272, 0x20000000),
    "unshare_cgroup": sc(272, 0x02000000), "unshare_uts": sc(272, 0x04000000),
    "unshare_ipc": sc(272, 0x08000000), "clone_newuser": sc(56, 0x10000000 | 17, 0, 0, 0, 0),
    "setns": sc(308, 0, 0),
    "keyctl": sc(250, 0, 0, 0, 0, 0), "add_key": sc(248, b"user", b"x", b"y", 1, -1),
    "bpf": sc(321, 0, None, 0), "perf_event_open": sc(298, None, 0, -1, -1, 0),
    "init_module": sc(175, None, 0, b""), "finit_module": sc(313, 0, b"", 0),
    "delete_module": sc(176, b"loop", 0), "kexec_load": sc(246, 0, 0, None, 0),
    "open_by_handle_at": sc(304, 0, None, 0), "syslog": sc(103, 3, None, 0),
    "ptrace_attach_guest": pt(16, 1), "ptrace_seize_guest": pt(0x4206, 1),
    "vm_writev_guest": sc(311, 1, 0, 0, 0, 0, 0), "pidfd_getfd_guest": sc(438, 0, 1, 0),
    "mknod_block": sc(133, b"/tmp/disk", 0o60600, 8 << 8),
    "sethostname": sc(170, b"x", 1), "settimeofday": sc(164, None, None),
    "swapon": sc(167, b"/tmp/swap", 0), "iopl": sc(172, 3), "ioperm": sc(173, 0, 1, 1),
    "acct": sc(163, b"/tmp/acct"), "userfaultfd": sc(323, 0),
    "kmsg": opened("/proc/kmsg"),
}
for name, family, kind, proto in (("packet", 17, socket.SOCK_RAW, 0),
                                  ("raw_icmp", socket.AF_INET, socket.SOCK_RAW, 1)):
    try:
        socket.socket(family, kind, proto).close(); res[name] = 0
    except OSError as e:
        res[name] = -e.errno
# The sandbox may still debug its own programs.
import subprocess
child = subprocess.Popen(["sleep", "30"])
res["ptrace_own_child"] = pt(16, child.pid)
if res["ptrace_own_child"] == 0:
    os.waitpid(child.pid, 0); pt(17, child.pid)
child.kill()
print(json.dumps(res))
""")
    assert out.pop("ptrace_own_child") == 0
    refused = {name: err for name, err in out.items() if err != -EPERM}
    assert not refused, f"not refused with EPERM: {refused}"


def test_no_service_account_token_and_no_cluster_env(fleet: list[Sandbox]) -> None:
    out = py(fleet[0], """
res = {p: os.path.exists(p) for p in ("/var/run/secrets/kubernetes.io", "/run/secrets",
                                       "/var/run/secrets")}
res["mounts"] = [l for l in open("/proc/self/mountinfo").read().splitlines()
                 if "secret" in l or "serviceaccount" in l]
res["env"] = sorted(k for k in os.environ if k.startswith("KUBERNETES") or "TOKEN" in k)
# The guest's environment (where the kubelet put KUBERNETES_* and the guest token) is
# closed to the sandbox: the guest is not dumpable.
res["guest_environ"] = opened("/proc/1/environ")
print(json.dumps(res))
""")
    assert out.pop("mounts") == [] and out.pop("env") == []
    assert out.pop("guest_environ") == -EACCES
    assert not any(out.values()), out


def test_no_host_devices_and_kernel_interfaces_read_only(fleet: list[Sandbox]) -> None:
    out = py(fleet[0], """
import glob, stat
devices = {}
for root, dirs, files in os.walk("/dev"):
    for name in dirs + files:
        st = os.lstat(os.path.join(root, name))
        if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
            kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
            devices[os.path.join(root, name)] = [kind, os.major(st.st_rdev)]
res = {"devices": devices, "opens": {p: opened(p, os.O_RDWR) for p in (
    "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/vsock", "/dev/vda",
    "/dev/sda", "/dev/nvme0n1", "/dev/fuse", "/dev/net/tun", "/dev/kvm")}}
# Opened for writing, never written.
res["writes"] = {p: opened(p, os.O_WRONLY) for p in (
    "/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
    "/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled")}
res["writes"]["/sys/abx"] = opened("/sys/abx", os.O_WRONLY | os.O_CREAT)
res["release_agents"] = {p: opened(p, os.O_WRONLY)
                         for p in glob.glob("/sys/fs/cgroup/*/release_agent")}
res["cgroup_files"] = {p: opened(p, os.O_WRONLY) for p in (
    "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/memory.max")}
res["sys_options"] = [l.split()[5] for l in open("/proc/self/mountinfo").read().splitlines()
                      if l.split()[4] == "/sys"]
print(json.dumps(res))
""")
    # Only the runtime's standard character devices, and no block device.
    allowed_majors = {1, 5, 136}  # mem (null, zero, full, random, urandom), tty/ptmx, pts
    assert all(kind == "c" and major in allowed_majors
               for kind, major in out["devices"].values()), out["devices"]
    assert all(err == -ENOENT for err in out["opens"].values()), out["opens"]
    assert all(err in (-ENOENT, -EROFS, -EACCES) for err in out["writes"].values()), out
    assert all(err in (-ENOENT, -EROFS) for err in out["release_agents"].values()), out
    assert all(err in (-ENOENT, -EROFS) for err in out["cgroup_files"].values()), out
    assert out["sys_options"] and all(o.split(",")[0] == "ro" for o in out["sys_options"])


# the host -------------------------------------------------------------------------------
def test_host_processes_invisible_and_unsignalled(fleet: list[Sandbox]) -> None:
    victim = subprocess.Popen(["sleep", "1000"])
    try:
        out = py(fleet[0], f"""
import signal
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
res = {{"pids": pids, "guest": open("/proc/1/cmdline").read().replace("\\0", " ")}}
try:
    os.kill({victim.pid}, signal.SIGKILL); res["kill_host"] = 0
except OSError as e:
    res["kill_host"] = -e.errno
print(json.dumps(res))
""")
        assert len(out["pids"]) < 10, out["pids"]  # the guest, this python and its shell
        assert "agent" in out["guest"]
        assert out["kill_host"] == -3  # ESRCH: host pids do not exist in here
        # Every process it may signal, and its own pid 1: the guest shrugs it off.
        fleet[0].commands.run("kill -9 -1; kill -9 1; echo done")
        time.sleep(0.5)
        assert victim.poll() is None, "a host process died"
        assert fleet[0].commands.run("echo ok").stdout == "ok\n"
    finally:
        victim.kill()
        victim.wait()


def test_host_files_unreachable_and_writes_stay_in_the_pod(fleet: list[Sandbox],
                                                           tag: str) -> None:
    secret = secrets.token_hex(16)
    canary = Path("/root") / tag
    fd = os.open(canary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret.encode())
    os.close(fd)
    try:
        out = py(fleet[0], f"""
res = {{}}
for p in ("/root/{tag}", "/proc/1/root/root/{tag}", "/proc/self/root/root/{tag}",
          "/workspace/../../../../root/{tag}", "/.abx/guest/../../../root/{tag}",
          "/proc/1/cwd/../../root/{tag}"):
    try:
        res[p] = open(p).read()
    except OSError as e:
        res[p] = -e.errno
for p in ("/usr/local/{tag}", "/usr/bin/{tag}", "/etc/{tag}", "/root/{tag}.w"):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write("inside")
print(json.dumps(res))
""")
        assert secret not in json.dumps(out)
        assert all(isinstance(err, int) and err < 0 for err in out.values()), out
        for path in (f"/usr/local/{tag}", f"/usr/bin/{tag}", f"/etc/{tag}",
                     f"/root/{tag}.w"):
            assert not Path(path).exists(), f"{path} appeared on the host"
    finally:
        canary.unlink()


def test_sandboxes_do_not_see_each_other(fleet: list[Sandbox], tag: str) -> None:
    one, two = fleet[0], fleet[1]
    one.files.write(f"/workspace/{tag}", "one")
    one.commands.run(f"echo one > /tmp/{tag}")
    handle = one.commands.run(f"exec sleep 600 # {tag}", background=True)
    try:
        out = py(two, f"""
seen = [p for p in os.listdir("/proc") if p.isdigit()
        and "{tag}" in open(f"/proc/{{p}}/cmdline").read()]
print(json.dumps({{"seen": seen, "ws": os.path.exists("/workspace/{tag}"),
                  "tmp": os.path.exists("/tmp/{tag}")}}))
""")
        assert out == {"seen": [], "ws": False, "tmp": False}
        assert not two.files.exists(f"/workspace/{tag}")
    finally:
        handle.kill()


# other sandboxes' guests -----------------------------------------------------------------
_DRIVE = """
import struct
def frame(obj):
    data = json.dumps(obj).encode()
    return struct.pack("!II", len(data), 0) + data
def ask(*frames):
    s = socket.create_connection((TARGET, PORT), timeout=10)
    try:
        for f in frames:
            s.sendall(frame(f))
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    n = struct.unpack("!II", buf[:8])[0] if len(buf) >= 8 else 0
    return json.loads(buf[8:8 + n]) if n else {"raw": buf.hex()}
EXEC = {"op": "exec", "argv": ["/bin/sh", "-c", "echo x > /tmp/" + TAG], "timeout": 5}
WRITE = {"op": "write", "path": "/workspace/" + TAG}
print(json.dumps({
    "no_hello": ask(EXEC), "no_hello_ping": ask({"op": "ping"}),
    "wrong": ask({"op": "hello", "token": "A" * 43}, EXEC),
    "empty": ask({"op": "hello", "token": ""}, WRITE),
    "not_a_string": ask({"op": "hello", "token": None}, EXEC),
    "a_list": ask({"op": "hello", "token": ["x"]}, {"op": "ping"}),
}))
"""


def _same_node_pair(cluster: Any, fleet: list[Sandbox]) -> tuple[Sandbox, Sandbox]:
    """Two sandboxes whose Pods share a node (the test cluster routes a Pod's traffic to
    its own node's pod subnet only): more are made until two do (3 nodes: 4 at most)."""
    while True:
        by_node: dict[str, Sandbox] = {}
        for sb in fleet:
            node = running_pod(cluster, sb.sandbox_id).spec.node_name
            if node in by_node:
                return by_node[node], sb
            by_node[node] = sb
        assert len(fleet) < 6, "the scheduler never put two sandboxes on one node"
        fleet.append(Sandbox.create(timeout=1800))


def test_a_sandbox_cannot_drive_another_sandboxs_guest(cluster: Any, fleet: list[Sandbox],
                                                        tag: str) -> None:
    """The guest port admits any source (the provider reaches it from outside the
    cluster); its token refuses everyone else. Where policies are enforced, a sandbox's
    own egress rules keep it off the pod network before that."""
    attacker, target = _same_node_pair(cluster, fleet)
    ip = running_pod(cluster, target.sandbox_id).status.pod_ip
    out = py(attacker, f"TARGET, PORT, TAG = {ip!r}, {objects.GUEST_PORT}, {tag!r}\n"
             + _DRIVE)
    for case in ("no_hello", "no_hello_ping"):
        assert "authentication required" in out[case]["error"]["message"], out
    for case in ("wrong", "empty", "not_a_string", "a_list"):
        assert "authentication failed" in out[case]["error"]["message"], out
    assert not target.files.exists(f"/tmp/{tag}")
    assert not target.files.exists(f"/workspace/{tag}")
    assert target.commands.run("echo ok").stdout == "ok\n"
    # The policy the cluster holds for it: ingress to the guest port only; no egress at
    # all for network "off" (the test cluster's CNI does not enforce it).
    policy = cluster.core().api_client.sanitize_for_serialization(
        _networking(cluster).read_namespaced_network_policy(
            objects.pod_name(attacker.sandbox_id), cluster.namespace))["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy.get("egress") in (None, [])
    assert policy["ingress"] == [{"ports": [{"port": objects.GUEST_PORT,
                                             "protocol": "TCP"}]}]


def _networking(cluster: Any) -> Any:
    from kubernetes import client

    return client.NetworkingV1Api(cluster.core().api_client)


def test_guest_token_only_a_secret_reference(cluster: Any, fleet: list[Sandbox]) -> None:
    sb = fleet[0]
    token = guest_token(cluster, sb.sandbox_id)
    pod = running_pod(cluster, sb.sandbox_id)
    manifest = cluster.core().api_client.sanitize_for_serialization(pod)
    assert token not in json.dumps(manifest)
    spec = manifest["spec"]
    (container,) = spec["containers"]
    assert container["env"] == [{"name": "ABX_GUEST_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": objects.secret_name(sb.sandbox_id), "key": objects.TOKEN_KEY}}}]
    assert "envFrom" not in container
    assert spec["automountServiceAccountToken"] is False
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(host), host
    assert {next(k for k in v if k != "name") for v in spec["volumes"]} <= {
        "persistentVolumeClaim", "emptyDir"}  # no hostPath, secret or projected token
    sc = container["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    record = cluster.core().read_namespaced_secret(objects.secret_name(sb.sandbox_id),
                                                   cluster.namespace).metadata
    assert token not in json.dumps([record.annotations, record.labels])
    # Nothing the sandbox can read holds it (what is readable is brought out and searched
    # here: the token never goes in).
    seen = py(sb, """
found = []
for p in os.listdir("/proc"):
    for name in ("environ", "cmdline"):
        try:
            found.append(open(f"/proc/{p}/{name}", "rb").read().decode("latin-1"))
        except OSError:
            pass
print(json.dumps(found + [json.dumps(dict(os.environ))]))
""")
    assert not any(token in text for text in seen)



def test_pid1_imports_nothing_the_sandbox_wrote(fleet: list[Sandbox], tmp_path: Path) -> None:
    """A Pod's guest code (first on pid 1's path) and python are in the image's writable
    layer: modules planted there after start (a guest module imported on first use, a
    stdlib name) never run in pid 1, and the guest still serves the operations that
    would have imported them."""
    sb = fleet[0]
    names = ("dir_unpack", "tarfile", "shutil", "subprocess")
    code = "open('/workspace/pwned', 'a').write(__name__ + ' ')"
    made = sb.commands.run("; ".join(f'echo "{code}" > /.abx/guest/{n}.py' for n in names))
    assert made.exit_code == 0, made.stderr
    try:
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "f").write_text("x")
        sb.files.upload_dir(tmp_path / "up", "/workspace/up")
        sb.files.download_dir("/workspace/up", tmp_path / "down")
        assert (tmp_path / "down" / "f").read_text() == "x"
        sb.pty.create().kill()
        assert sb.commands.run("cat /workspace/pwned 2>/dev/null").stdout == ""
    finally:
        sb.commands.run("rm -f " + " ".join(f"/.abx/guest/{n}.py" for n in names))
