"""The isolation policy as data: the root OCI config, its rootless transform, seccomp.

Pure functions, checked in-process (no root, no runc): what every sandbox is started with.
"""

from __future__ import annotations

import copy

from agent_sandbox.backends.runc.oci.bundle import BundleSpec, UserHost, build_config, to_rootless
from agent_sandbox.backends.runc.oci.seccomp import seccomp_profile
from agent_sandbox.config.engine import HOST_ID_BASE, HOST_ID_COUNT, Limits
from agent_sandbox.core.inside import CAPABILITIES, GUEST_DIR, GUEST_RUN_DIR

SPEC = BundleSpec(sandbox_id="sbx-abcdefghij", rootfs="/r", workspace="/w", run_dir="/run",
                  guest_dir="/g", python=["/py"], limits=Limits(memory_mb=256, cpu=0.5,
                                                                 pids=64, disk_mb=100),
                  empty_file="/empty")
USER = UserHost(
    id_map=([{"containerID": 0, "hostID": 1000, "size": 1}],
            [{"containerID": 0, "hostID": 1000, "size": 1}]),
    rootfs_mounts=({"destination": "/", "type": "overlay", "source": "overlay",
                    "options": ["userxattr"]},),
    rlimits=({"type": "RLIMIT_FSIZE", "hard": 5, "soft": 5},),
    cgroups="systemd")


def _mount(config: dict, dest: str) -> dict:
    return next(m for m in config["mounts"] if m["destination"] == dest)


def test_root_config_isolates() -> None:
    config = build_config(SPEC)
    process, linux = config["process"], config["linux"]
    assert process["noNewPrivileges"] is True
    caps = set(process["capabilities"]["bounding"])
    assert caps == set(CAPABILITIES) and not caps & {"CAP_NET_RAW", "CAP_MKNOD",
                                                     "CAP_SYS_ADMIN", "CAP_SYS_PTRACE"}
    assert {n["type"] for n in linux["namespaces"]} == {
        "pid", "ipc", "uts", "mount", "user", "network", "cgroup"}
    assert linux["uidMappings"] == [{"containerID": 0, "hostID": HOST_ID_BASE,
                                     "size": HOST_ID_COUNT}]
    assert linux["resources"]["memory"] == {"limit": 256 << 20, "swap": 256 << 20}
    assert linux["resources"]["pids"] == {"limit": 64}
    assert linux["resources"]["cpu"]["quota"] == 50_000
    assert "/proc/kcore" in linux["maskedPaths"] and "/proc/sys" in linux["readonlyPaths"]
    # Host-side directories reach the sandbox without setuid or device files; the guest's
    # code and the preload mask read-only; the run dir not executable.
    for dest in ("/workspace", GUEST_DIR, GUEST_RUN_DIR, "/etc/ld.so.preload"):
        assert {"nosuid", "nodev"} <= set(_mount(config, dest)["options"]), dest
    for dest in (GUEST_DIR, "/etc/ld.so.preload"):
        assert "ro" in _mount(config, dest)["options"]
    assert "noexec" in _mount(config, GUEST_RUN_DIR)["options"]
    assert process["rlimits"][-1] == {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}


def test_rootless_is_a_transform_that_leaves_the_root_config_alone() -> None:
    root = build_config(SPEC)
    before = copy.deepcopy(root)
    user = to_rootless(root, USER)
    assert root == before  # a new config; the root one untouched
    assert user["linux"]["uidMappings"] == USER.id_map[0]
    assert user["mounts"][0] == USER.rootfs_mounts[0]  # overlays first, then the rest
    assert user["mounts"][1:] == root["mounts"]
    assert user["process"]["rlimits"] == root["process"]["rlimits"] + list(USER.rlimits)
    assert "oomScoreAdj" not in user["process"]
    assert user["linux"]["cgroupsPath"] == "user.slice:abx:sbx-abcdefghij"
    assert "devices" not in user["linux"]["resources"]
    assert user["linux"]["seccomp"] == root["linux"]["seccomp"]  # the same policy
    # Everything else is the root policy as it is.
    for key in ("namespaces", "maskedPaths", "readonlyPaths"):
        assert user["linux"][key] == root["linux"][key]
    assert user["process"]["capabilities"] == root["process"]["capabilities"]


def test_rootless_without_cgroups_writes_none() -> None:
    user = to_rootless(build_config(SPEC), UserHost(id_map=USER.id_map, cgroups=""))
    assert "cgroupsPath" not in user["linux"] and "resources" not in user["linux"]


def test_seccomp_denies_what_reaches_past_the_sandbox() -> None:
    profile = seccomp_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = set(profile["syscalls"][0]["names"])
    for name in ("mount", "umount2", "open_tree", "move_mount", "fsopen", "init_module",
                 "finit_module", "kexec_load", "bpf", "perf_event_open", "add_key",
                 "keyctl", "userfaultfd", "io_uring_setup", "unshare", "setns",
                 "clock_settime"):
        assert name in denied, name
    rules = {r["names"][0]: r for r in profile["syscalls"][1:]}
    assert rules["clone3"]["errnoRet"] == 38  # ENOSYS: libc falls back to clone
    assert rules["clone"]["args"][0]["value"] == 0x10000000  # CLONE_NEWUSER refused
    assert rules["ptrace"]["args"][0]["valueTwo"] == 1  # never the guest (pid 1)
    assert rules["socket"]["args"][0]["valueTwo"] == 40  # AF_VSOCK
