"""``abx doctor``: can this host run sandboxes? Each failure comes with the fix."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from agent_sandbox.cli.output import console, print_json, want_json
from agent_sandbox.cli.settings import cli_settings

NAMESPACES = ("mnt", "pid", "ipc", "uts", "net", "user", "cgroup")
CONTROLLERS = ("cpu", "memory", "pids")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # a failed optional check only warns


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _rootless() -> bool:
    return os.geteuid() != 0


def check_engine() -> Check:
    """Which engine this process would use (``ABX_ENGINE``, the daemon, root or rootless)."""
    from agent_sandbox.providers.engine_choice import choose_engine

    choice = choose_engine(cli_settings())
    if choice.kind is None:
        return Check("engine", False, choice.error or choice.reason,
                     "see docs/daemon.md (which engine a process uses)")
    where = f" at {choice.target}" if choice.target else ""
    return Check("engine", True, f"{choice.kind}{where} ({choice.reason})")


def check_root() -> Check:
    """Which engine this user gets: root's, or the rootless one (user namespaces)."""
    if not _rootless():
        return Check("engine mode", True, "root engine (overlays and disks on the host, "
                     "one shared id range)")
    from agent_sandbox.runtime import rootless

    problem = rootless.userns_problem()
    if problem:
        from agent_sandbox.providers.engine_choice import choose_engine

        # Only a warning for a user served by the daemon or a gateway: no local engine runs.
        served = choose_engine(cli_settings()).kind in ("daemon", "remote")
        return Check("engine mode", False, f"uid {os.geteuid()}: the rootless engine cannot "
                     f"run: {problem}", "enable unprivileged user namespaces, or run as root",
                     required=not served)
    return Check("engine mode", True, f"rootless engine as uid {os.geteuid()} "
                 f"({rootless.id_map().describe()})")


def check_limits() -> Check:
    """What each limit really is in this mode."""
    if _rootless():
        from agent_sandbox.runtime import rootless

        text = "; ".join(f"{k}: {v}" for k, v in rootless.describe_limits().items())
        delegated = rootless.delegated_cgroup() is not None
        return Check("limits enforced", delegated, text,
                     "" if delegated else "for totals per sandbox: cgroup v2 with systemd "
                     "delegation (memory, pids, cpu), or run as root", required=False)
    from agent_sandbox.runtime.host_root import enforced_limits

    enforced = enforced_limits()
    missing = [k for k, on in enforced.items() if not on]
    return Check("limits enforced", not missing,
                 ", ".join(f"{k}: {'yes' if on else 'NO'}" for k, on in enforced.items()),
                 "" if not missing else "see the cgroup controllers check", required=False)


def check_subids() -> Check:
    """The root engine's id range must be nobody's subordinate range."""
    from agent_sandbox.runtime import subids
    from agent_sandbox.runtime.config import HOST_ID_BASE, HOST_ID_COUNT

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
                     "as root: python -m agent_sandbox.runtime.subids", required=False)
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
        from agent_sandbox.runtime import rootless

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


def check_data_dir() -> Check:
    path = cli_settings().data_dir
    if path.exists():
        ok = os.access(path, os.W_OK | os.X_OK)
        fix = f"chown root {path} && chmod 711 {path}" if not _rootless() else \
            f"chown {os.geteuid()} {path} && chmod 700 {path}"
        return Check("data dir", ok, f"{path} ({'writable' if ok else 'not writable'})",
                     "" if ok else fix)
    parent = next((p for p in path.parents if p.exists()), Path("/"))
    ok = os.access(parent, os.W_OK)
    return Check("data dir", ok, f"{path} (created on first use)",
                 "" if ok else f"mkdir -p {path} && chmod 711 {path}")


def check_supervisor() -> Check:
    """The data dir's lifecycle supervisor: it pauses idle sandboxes when no engine runs."""
    import time

    from agent_sandbox.runtime import supervisor
    from agent_sandbox.runtime.config import default_data_dir

    found = supervisor.status(default_data_dir())
    if not found.running:
        return Check("lifecycle supervisor", True, "not running (it starts with the first "
                     "sandbox and exits once none can time out)", required=False)
    if not found.pid:
        return Check("lifecycle supervisor", True, "starting", required=False)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found.since))
    return Check("lifecycle supervisor", True, f"pid {found.pid}, running since {since} "
                 "(pauses idle sandboxes, stops long-paused ones)", required=False)


def check_disk_headroom() -> Check:
    """Free space where sandboxes live, against the reserve creates keep."""
    from agent_sandbox.runtime.config import EngineConfig

    data_dir = cli_settings().data_dir
    path = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    free_mb = shutil.disk_usage(path).free >> 20
    reserve_mb = EngineConfig().host_reserve_mb
    ok = free_mb >= reserve_mb + 1024
    return Check("disk headroom", ok, f"{free_mb / 1024:.1f} GB free on {path} (creates keep "
                 f"{reserve_mb / 1024:.0f} GB free)",
                 "" if ok else "free space: abx sandbox list, kill unused sandboxes, delete "
                 "volumes (abx doctor --cleanup shows what is left)", required=False)


def check_templates() -> Check:
    """The templates of the engine this user really gets (a daemon's or gateway's too)."""
    from agent_sandbox.providers.select import current_engine, default_provider

    settings = cli_settings()
    local = current_engine(settings).kind in ("embedded", "rootless")
    if local and not settings.data_dir.exists():
        return Check("templates", True, "none yet (the built-in 'base' appears on first use)",
                     required=False)
    try:
        names = [t.name for t in default_provider(settings).list_templates()]
    except Exception as exc:  # noqa: BLE001 - report, do not crash
        return Check("templates", False, f"cannot open the engine: {exc}",
                     "fix the failures above, then run `abx doctor` again")
    return Check("templates", bool(names), ", ".join(names) or "none",
                 "" if names else "abx template build NAME DIR")


def run_checks() -> list[Check]:
    rootless = _rootless()
    checks = [check_engine(), check_root(), check_runtime(), check_namespaces(), check_userns(),
              check_overlay(), check_cgroups(), check_limits(), check_subids(),
              check_seccomp(),
              check_tool("mkfs.ext4", "e2fsprogs", "sandbox disks", not rootless),
              check_tool("nft", "nftables", "network policies (every sandbox but 'off')",
                         False),
              check_tool("ip", "iproute2", "network policies", False),
              check_tool("nsenter", "util-linux", "network policies", False)]
    if rootless:
        checks += [check_tool("newuidmap", "uidmap", "ids 1-65535 inside sandboxes", False)]
    checks += [check_data_dir(), check_supervisor(), check_disk_headroom()]
    if all(c.ok for c in checks if c.required):
        checks.append(check_templates())
    return checks


def checks_table(checks: list[Check]) -> Table:
    """Every word of a detail or a fix is shown: long commands and paths fold onto the
    next line instead of being cut off with an ellipsis."""
    table = Table("check", "", "detail", "fix")
    table.columns[0].no_wrap = True
    table.columns[1].no_wrap = True
    for column in table.columns[2:]:
        column.overflow = "fold"
        column.ratio = 1
    for c in checks:
        mark = "[green]ok[/green]" if c.ok else ("[red]FAIL[/red]" if c.required
                                                 else "[yellow]warn[/yellow]")
        table.add_row(c.name, mark, Text(c.detail), Text(c.fix))  # not Rich markup
    return table


def doctor(json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
           = False,
           cleanup: Annotated[bool, typer.Option(
               "--cleanup", help="Instead: unmount what the embedded engine left on the host "
                                 "(finish crashed work, drain the pool, release template "
                                 "views); with no sandbox left the data dir can be deleted.")]
           = False) -> None:
    """Check this host can run sandboxes, and print the fix for each failure.

    Engine (root, daemon, rootless), runc, namespaces, overlayfs, cgroups, real limits, seccomp.

    Exits 1 when a required check fails."""
    if cleanup:
        from agent_sandbox.cli.cleanup import cleanup as run_cleanup

        run_cleanup(json_out)
        return
    checks = run_checks()
    failed = [c for c in checks if not c.ok and c.required]
    if want_json(json_out):
        print_json({"ok": not failed, "checks": [asdict(c) for c in checks]})
    else:
        console.print(checks_table(checks))
        if not failed:
            console.print("All required checks passed.")
        else:  # whole lines too, to copy and paste (the table folds long ones)
            console.print(f"{len(failed)} required check(s) failed; the fixes:")
            for c in failed:
                console.print(Text(f"  {c.name}: {c.fix}"))
    if failed:
        raise typer.Exit(1)
