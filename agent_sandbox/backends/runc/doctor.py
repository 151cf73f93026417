"""Can this host run sandboxes on runc? Each check says how it stands and the fix
(``abx doctor`` shows them)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from agent_sandbox.config.settings import Settings
from agent_sandbox.core.health import Check

NAMESPACES = ("mnt", "pid", "ipc", "uts", "net", "user", "cgroup")
CONTROLLERS = ("cpu", "memory", "pids")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _rootless() -> bool:
    return os.geteuid() != 0


def check_root(served: bool) -> Check:
    """Which engine this user gets: root's, or the rootless one (user namespaces)."""
    if not _rootless():
        return Check("engine mode", True, "root engine (overlays and disks on the host, "
                     "one shared id range)")
    from agent_sandbox.backends.runc.host import rootless_setup as rootless

    problem = rootless.userns_problem()
    if problem:
        # Only a warning for a user served by the daemon or a gateway: no local engine runs.
        return Check("engine mode", False, f"uid {os.geteuid()}: the rootless engine cannot "
                     f"run: {problem}", "enable unprivileged user namespaces, or run as root",
                     required=not served)
    return Check("engine mode", True, f"rootless engine as uid {os.geteuid()} "
                 f"({rootless.id_map().describe()})")


def check_limits() -> Check:
    """What each limit really is in this mode."""
    if _rootless():
        from agent_sandbox.backends.runc.host import rootless_setup as rootless

        text = "; ".join(f"{k}: {v}" for k, v in rootless.describe_limits().items())
        delegated = rootless.delegated_cgroup() is not None
        return Check("limits enforced", delegated, text,
                     "" if delegated else "for totals per sandbox: cgroup v2 with systemd "
                     "delegation (memory, pids, cpu), or run as root", required=False)
    from agent_sandbox.backends.runc.host.root import enforced_limits

    enforced = enforced_limits()
    missing = [k for k, on in enforced.items() if not on]
    return Check("limits enforced", not missing,
                 ", ".join(f"{k}: {'yes' if on else 'NO'}" for k, on in enforced.items()),
                 "" if not missing else "see the cgroup controllers check", required=False)


def check_subids() -> Check:
    """The root engine's id range must be nobody's subordinate range."""
    from agent_sandbox.backends.runc.host import subids
    from agent_sandbox.config.engine import HOST_ID_BASE, HOST_ID_COUNT

    span = f"{HOST_ID_BASE}-{HOST_ID_BASE + HOST_ID_COUNT - 1}"
    clash = [f"{path.name}: {entry}" for path in subids.FILES for entry in subids.overlaps(path)]
    if clash:
        return Check("subordinate ids", False, f"overlap the root engine's sandbox ids {span}: "
                     f"{', '.join(clash)} (those users' containers share host ids with "
                     "root-engine sandboxes)", "move those ranges: usermod --del-subuids/"
                     "--add-subuids (and the subgid options)", required=False)
    if not all(subids.reserved(_read(str(path))) for path in subids.FILES):
        return Check("subordinate ids", False, f"{span} is not reserved in /etc/subuid and "
                     "/etc/subgid: useradd may hand it to the next user",
                     "as root: python -m agent_sandbox.backends.runc.host.subids", required=False)
    return Check("subordinate ids", True, f"{span} reserved for {subids.OWNER}")


def check_runtime() -> Check:
    found = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin")
    crun = shutil.which("crun")
    if found:
        return Check("container runtime", True, f"runc at {found}")
    if crun:
        return Check("container runtime", False, f"only crun at {crun}; the engine drives runc",
                     "apt-get install -y runc")
    return Check("container runtime", False, "runc not found", "apt-get install -y runc")


def check_namespaces() -> Check:
    missing = [ns for ns in NAMESPACES if not Path(f"/proc/self/ns/{ns}").exists()]
    if missing:
        return Check("namespaces", False, f"missing: {', '.join(missing)}",
                     "use a kernel built with CONFIG_NAMESPACES (and each *_NS option)")
    return Check("namespaces", True, ", ".join(NAMESPACES))


def check_userns() -> Check:
    raw = _read("/proc/sys/user/max_user_namespaces").strip()
    if not raw:
        return Check("user namespaces", False, "/proc/sys/user/max_user_namespaces missing",
                     "use a kernel built with CONFIG_USER_NS")
    if int(raw) <= 0:
        return Check("user namespaces", False, f"max_user_namespaces = {raw}",
                     "sysctl -w user.max_user_namespaces=15000 (persist it in "
                     "/etc/sysctl.d/)")
    return Check("user namespaces", True, f"max_user_namespaces = {raw}")


def check_overlay() -> Check:
    if "overlay" in _read("/proc/filesystems").split():
        return Check("overlayfs", True, "overlay in /proc/filesystems")
    return Check("overlayfs", False, "overlay not in /proc/filesystems", "modprobe overlay")


def check_cgroups() -> Check:
    root = Path("/sys/fs/cgroup")
    if _rootless():
        from agent_sandbox.backends.runc.host import rootless_setup as rootless

        cg = rootless.delegated_cgroup()
        return Check("cgroup controllers", bool(cg), f"delegated to this user: {cg}" if cg else
                     "none delegated to this user (cgroup v1/hybrid, or no systemd "
                     "delegation): rlimits stand in", "" if cg else
                     "boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) and log in "
                     "through systemd (user@.service delegates memory, pids, cpu)",
                     required=False)
    v2 = set(_read(str(root / "cgroup.controllers")).split())
    have = {c for c in CONTROLLERS if c in v2 or (root / c).is_dir()}  # v2, or v1 hierarchy
    missing = [c for c in CONTROLLERS if c not in have]
    mode = "v2" if v2 else "v1"
    if not v2 and not any((root / c).is_dir() for c in CONTROLLERS):
        return Check("cgroup controllers", False, "no cgroup hierarchy at /sys/fs/cgroup",
                     "mount cgroup2: mount -t cgroup2 none /sys/fs/cgroup")
    if missing:
        fix = (f"echo '{' '.join('+' + c for c in missing)}' > "
               "/sys/fs/cgroup/cgroup.subtree_control" if v2 else
               f"mount the v1 controller(s): {', '.join(missing)} (or boot with cgroup v2)")
        return Check("cgroup controllers", False, f"{mode}; missing: {', '.join(missing)} "
                     "(limits are not enforced without them)", fix)
    return Check("cgroup controllers", True, f"{mode}: {', '.join(sorted(have))}")


def check_seccomp() -> Check:
    line = next((x for x in _read("/proc/self/status").splitlines()
                 if x.startswith("Seccomp:")), "")
    if line:
        return Check("seccomp", True, line.replace("\t", " "))
    return Check("seccomp", False, "no Seccomp line in /proc/self/status",
                 "use a kernel built with CONFIG_SECCOMP and CONFIG_SECCOMP_FILTER")


def check_tool(binary: str, package: str, why: str, required: bool) -> Check:
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin")
    if found:
        return Check(binary, True, f"{found} ({why})", required=required)
    return Check(binary, False, f"not found ({why})", f"apt-get install -y {package}",
                 required=required)


def check_network_proxy(settings: Settings, local: bool) -> list[Check]:
    """Start a policy proxy the way this host's engine does (its Python, its user) and ask
    it for the ``registries`` preset's names: proves name lookups work in the proxy (a
    proxy whose user cannot read its Python fails them), and that those names resolve to
    addresses a sandbox may reach (a host resolver answering with a reserved range, as
    some mirrors and filtering resolvers do, leaves them refused)."""
    from agent_sandbox.backends.runc.netproxy import launch as netproc
    from agent_sandbox.backends.runc.netproxy.config import OPEN_RANGES_SETTING
    from agent_sandbox.config.engine import EngineConfig
    from agent_sandbox.core.netrules import PRESETS
    if not local:
        return [Check("network proxy", True, "not checked: this host's engine runs in a "
                      "daemon, a gateway or Kubernetes (run abx doctor where it runs)",
                      required=False)]
    names = [n for n in PRESETS["registries"] if not n.startswith("*.")]
    try:
        found = netproc.probe(names, "registries", EngineConfig.from_settings(settings))
    except Exception as exc:  # noqa: BLE001 - report, do not crash
        return [Check("network proxy", False, str(exc), "a networked sandbox cannot start "
                      "here; the message says what failed (rerun as root for the root "
                      "engine's proxy)", required=False)]
    runtime = found.runtime
    who = "nobody (uid 65534)" if os.geteuid() == 0 else "this user"
    detail = f"{runtime.python} as {who}; name lookups work"
    proxy = Check("network proxy", runtime.readable, detail + (f" ({runtime.note})"
                  if runtime.note else ""), "" if runtime.readable else
                  "make the engine's venv from a Python every user can read: "
                  "/usr/bin/python3 -m venv", required=False)
    refused = {name: why for name, why in found.answers.items() if why}
    if not refused:
        return [proxy, Check("registries", True, f"{len(names)} names of the 'registries' "
                             "preset resolve to addresses a sandbox may reach",
                             required=False)]
    groups: dict[str, list[str]] = {}  # the same reason for several names: said once
    for name, why in refused.items():
        groups.setdefault(why.replace(name, "\0"), []).append(name)
    said = "; ".join(f"{', '.join(group)}: {refused[group[0]]}" for group in groups.values())
    opening = sorted({cidr for why in refused.values()
                      for found in re.findall(rf"{OPEN_RANGES_SETTING}=(\S+)", why)
                      for cidr in found.split(",")})
    fix = (f"if those addresses really are the registries (a mirror, a filtering resolver), "
           f"set {OPEN_RANGES_SETTING}={','.join(opening)} for the engine; else fix this "
           "host's DNS" if opening else "fix this host's DNS, or give the names fixed "
           "addresses (ABX_NETWORK_HOSTS)")
    return [proxy, Check("registries", False, f"{len(refused)} of {len(names)} names of the "
                         f"'registries' preset cannot be reached from a sandbox: {said}", fix,
                         required=False)]


def check_data_dir(settings: Settings) -> Check:
    """What the engine checks at its start (backends/runc/host_paths.py): the data dir takes new
    directories, and the root engine's sandboxes can reach it and the guest's code."""
    from agent_sandbox.backends.runc import host_paths
    from agent_sandbox.config.engine import HOST_ID_BASE

    path = settings.data_dir
    problem = host_paths.data_dir_problem(path, None if _rootless() else HOST_ID_BASE)
    if problem is not None:
        return Check("data dir", False, problem.what, problem.fix)
    state = "writable" if path.exists() else "created on first use"
    return Check("data dir", True, f"{path} ({state})")


def check_supervisor(settings: Settings) -> Check:
    """The data dir's lifecycle supervisor: it pauses idle sandboxes when no engine runs."""
    import time

    from agent_sandbox.backends.runc import supervisor
    found = supervisor.status(settings.data_dir)
    if not found.running:
        return Check("lifecycle supervisor", True, "not running (it starts with the first "
                     "sandbox and exits once none can time out)", required=False)
    if not found.pid:
        return Check("lifecycle supervisor", True, "starting", required=False)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found.since))
    return Check("lifecycle supervisor", True, f"pid {found.pid}, running since {since} "
                 "(pauses idle sandboxes, stops long-paused ones)", required=False)


def check_disk_headroom(settings: Settings) -> Check:
    """Free space where sandboxes live, against the reserve creates keep."""
    from agent_sandbox.config.engine import EngineConfig

    data_dir = settings.data_dir
    path = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    free_mb = shutil.disk_usage(path).free >> 20
    reserve_mb = EngineConfig().host_reserve_mb
    ok = free_mb >= reserve_mb + 1024
    return Check("disk headroom", ok, f"{free_mb / 1024:.1f} GB free on {path} (creates keep "
                 f"{reserve_mb / 1024:.0f} GB free)",
                 "" if ok else "free space: abx sandbox list, kill unused sandboxes, delete "
                 "volumes (abx doctor --cleanup shows what is left)", required=False)


def check_end_of_life(settings: Settings) -> Check:
    """The operator's end of life for paused sandboxes (ABX_PAUSED_MAX_AGE)."""
    age = settings.paused_max_age
    if not age:
        return Check("end of life", True, "paused sandboxes are kept until killed "
                     "(ABX_PAUSED_MAX_AGE=0); each may still end by its own lifetime or "
                     "on_timeout=kill", required=False)
    return Check("end of life", True, f"a paused sandbox unused for {age / 86400:g} days "
                 f"({age:g} s, ABX_PAUSED_MAX_AGE) is ended, its volume kept or deleted as "
                 "it asked; ends are in the data dir's audit.log", required=False)


def check_criu() -> Check:
    """Memory snapshots (pause keeping memory, snapshot, fork) need a CRIU >= 4.2 whose
    `criu check` passes on this kernel; without one pause freezes and snapshots refuse."""
    from agent_sandbox.backends.runc import criu

    found = criu.find()
    if found.ok:
        return Check("memory snapshots", True, f"CRIU {found.version} ({found.path}): "
                     "`criu check` passes")
    return Check("memory snapshots", False, f"{found.problem}: pause freezes the sandbox "
                 "(memory stays resident) and snapshot/fork refuse", criu.FIX, required=False)


def host_checks(settings: Settings, *, local: bool, served: bool) -> list[Check]:
    """Can this host run sandboxes on runc (``local``: this process's engine would; ``served``:
    a daemon or a gateway runs them instead, so a missing piece here only warns)."""
    rootless = _rootless()
    checks = [check_root(served), check_runtime(), check_namespaces(), check_userns(),
              check_overlay(), check_cgroups(), check_limits(), check_subids(),
              check_seccomp(),
              check_tool("mkfs.ext4", "e2fsprogs", "sandbox disks", not rootless),
              check_tool("nft", "nftables", "network policies (every sandbox but 'off')",
                         False),
              check_tool("ip", "iproute2", "network policies", False),
              check_tool("nsenter", "util-linux", "network policies", False),
              *check_network_proxy(settings, local)]
    if rootless:
        checks += [check_tool("newuidmap", "uidmap", "ids 1-65535 inside sandboxes", False)]
    return checks + [check_criu(), check_data_dir(settings), check_supervisor(settings),
                     check_end_of_life(settings), check_disk_headroom(settings)]
