"""``abx daemon``: the shared daemon as a systemd service (install, uninstall, status).

The daemon is ``abx serve --unix /run/abx/abx.sock`` run by root: ordinary users in group
``abx`` get sandboxes through it, each user its own tenant. ``install`` writes the unit,
creates the group and, where systemd is the init system, enables and starts it; elsewhere
(a container, WSL without systemd) it says how to start the daemon by hand.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

import agent_sandbox
from agent_sandbox.providers.choice import (
    DAEMON_GROUP,
    DEFAULT_DAEMON_SOCKET,
    probe_daemon,
)
from agent_sandbox.surfaces.cli.clients import launch_command
from agent_sandbox.surfaces.cli.output import CliError, console, note, print_json, want_json

app = typer.Typer(help="The shared daemon for ordinary users (a systemd service on a unix "
                       "socket): install, uninstall, status.", no_args_is_help=True)

UNIT_NAME = "abx.service"
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
UnitDir = Annotated[Path, typer.Option(help="Where the unit file goes (for packaging and "
                                       "tests; systemd reads /etc/systemd/system).")]
Socket = Annotated[str, typer.Option("--socket", help="The daemon's unix socket.")]


def systemd_problem() -> str | None:
    """None when systemd can manage the service here; otherwise why not."""
    try:
        comm = Path("/proc/1/comm").read_text().strip()
    except OSError:
        comm = ""
    # sd_booted(): /run/systemd/system exists; and PID 1 is systemd (not a container init).
    if not (os.path.isdir("/run/systemd/system") and comm == "systemd"):
        return f"systemd is not running here (PID 1 is {comm or 'unknown'}, not systemd)"
    if shutil.which("systemctl") is None:
        return "systemd is running but systemctl is not on PATH"
    return None


def systemd_running() -> bool:
    return systemd_problem() is None


def unit_text(socket: str = DEFAULT_DAEMON_SOCKET, group: str = DAEMON_GROUP,
              data_dir: str | None = None) -> str:
    serve = [*launch_command(), "serve", "--unix", socket, "--group", group]
    runtime_dir = Path(socket).parent
    lines = [
        "[Unit]",
        "Description=agent-sandbox daemon: sandboxes for local users (abx serve --unix)",
    ]
    docs = Path(agent_sandbox.__file__).resolve().parents[1] / "docs" / "daemon.md"
    if docs.is_file():  # a source checkout; an installed wheel carries no docs
        lines.append(f"Documentation=file://{docs}")
    lines += [
        "After=network.target",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + shlex.join(serve),
    ]
    if runtime_dir.parent == Path("/run"):
        # systemd makes /run/<name> (0755, root) at start and removes it at stop.
        lines += [f"RuntimeDirectory={runtime_dir.name}", "RuntimeDirectoryMode=0755"]
    if data_dir:
        lines.append(f"Environment=ABX_DATA_DIR={data_dir}")
    lines += [
        "Environment=PYTHONUNBUFFERED=1",
        # Only the daemon is stopped on restart: sandboxes (runc containers) keep running
        # and the next daemon finds them again.
        "KillMode=process",
        "Restart=on-failure",
        "RestartSec=2",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=60)


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise CliError(f"{what} needs root: run `sudo {shlex.join(launch_command())} daemon "
                       f"{what.split()[-1]}`")


@app.command(epilog="Examples:\n\n  sudo abx daemon install\n\n"
                    "  sudo usermod -aG abx alice   # then alice logs in again")
def install(
    socket: Socket = DEFAULT_DAEMON_SOCKET,
    group: Annotated[str, typer.Option(help="Users in this group may use the daemon.")]
    = DAEMON_GROUP,
    unit_dir: UnitDir = DEFAULT_UNIT_DIR,
    data_dir: Annotated[str | None, typer.Option(
        help="Engine state directory for the daemon (default /var/lib/agent-sandbox).")]
    = None,
    start: Annotated[bool, typer.Option(help="Enable and start it with systemctl (when "
                                        "systemd runs).")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Write the systemd unit, create group abx, and enable + start the daemon."""
    from agent_sandbox.surfaces.gateway.unix import ensure_group

    _need_root("daemon install")
    if not socket.startswith("/"):
        raise CliError(f"--socket must be an absolute path, not {socket!r}", 2)
    if data_dir is not None and not data_dir.startswith("/"):
        raise CliError(f"--data-dir must be an absolute path, not {data_dir!r}", 2)
    ensure_group(group)
    unit_dir.mkdir(parents=True, exist_ok=True)
    unit = unit_dir / UNIT_NAME
    tmp = unit.with_name(unit.name + ".tmp")
    tmp.write_text(unit_text(socket, group, data_dir))
    os.chmod(tmp, 0o644)
    os.replace(tmp, unit)
    problem = systemd_problem()
    result: dict[str, Any] = {"unit": str(unit), "socket": socket, "group": group,
                              "systemd": problem is None, "started": False}
    manual = f"sudo {shlex.join([*launch_command(), 'serve', '--unix', socket, '--group', group])}"
    if not start:
        message = f"wrote {unit}; not started (--no-start)"
    elif not result["systemd"]:
        message = (f"wrote {unit}, but {problem}, so the service cannot be enabled or "
                   f"started. Start the daemon by hand (it runs in the "
                   f"foreground; put it under your supervisor):\n  mkdir -p "
                   f"{shlex.quote(str(Path(socket).parent))} && {manual}")
        result["manual"] = manual
    elif unit_dir.resolve() != DEFAULT_UNIT_DIR:
        message = (f"wrote {unit}; it is outside {DEFAULT_UNIT_DIR}, so it was not enabled "
                   f"(`systemctl link {unit}` then `systemctl enable --now {UNIT_NAME}`)")
    else:
        for args in (("daemon-reload",), ("enable", "--now", UNIT_NAME)):
            proc = _systemctl(*args)
            if proc.returncode != 0:
                raise CliError(f"wrote {unit}, but `systemctl {' '.join(args)}` failed: "
                               f"{proc.stderr.strip()}")
        result["started"] = True
        message = (f"installed and started {UNIT_NAME}: socket {socket} (group {group}, mode "
                   f"0660). Add users with `usermod -aG {group} USER` (they log in again).")
    result["message"] = message
    if want_json(json_out):
        print_json(result)
    else:
        console.print(message)


@app.command(epilog="Example: sudo abx daemon uninstall")
def uninstall(unit_dir: UnitDir = DEFAULT_UNIT_DIR, json_out: JsonOpt = False) -> None:
    """Stop and disable the daemon and remove its unit (sandboxes and group abx are kept)."""
    _need_root("daemon uninstall")
    unit = unit_dir / UNIT_NAME
    systemd = systemd_running() and unit_dir.resolve() == DEFAULT_UNIT_DIR
    if systemd:
        _systemctl("disable", "--now", UNIT_NAME)
    existed = unit.exists()
    unit.unlink(missing_ok=True)
    if systemd:
        _systemctl("daemon-reload")
    message = (f"removed {unit}" if existed else f"{unit} was not installed")
    if not systemd:
        message += ("; systemd does not manage it here, so stop a daemon you started by hand "
                    "yourself")
    if want_json(json_out):
        print_json({"unit": str(unit), "removed": existed, "systemd": systemd,
                    "message": message})
    else:
        console.print(message)


def _socket_state(path: str) -> dict[str, Any]:
    import grp
    import stat

    info: dict[str, Any] = {"path": path, "exists": os.path.exists(path)}
    if info["exists"]:
        st = os.stat(path)
        try:
            info["group"] = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            info["group"] = str(st.st_gid)
        info["mode"] = f"{stat.S_IMODE(st.st_mode):04o}"
    problem = probe_daemon(path)
    info["reachable"] = problem is None
    if problem:
        info["problem"] = problem
    return info


def _health(path: str) -> dict[str, Any] | None:
    import httpx2 as httpx

    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), timeout=5) as client:
            r = client.get("http://abx-daemon/health")
    except httpx.TransportError:
        return None
    try:
        body = r.json()
    except ValueError:
        body = {"text": r.text[:200]}
    return {"status_code": r.status_code, **(body if isinstance(body, dict) else {})}


@app.command(epilog="Example: abx daemon status --json")
def status(socket: Socket = DEFAULT_DAEMON_SOCKET, unit_dir: UnitDir = DEFAULT_UNIT_DIR,
           json_out: JsonOpt = False) -> None:
    """Is the daemon installed, running, reachable by me? Exit 1 when it is not reachable."""
    unit = unit_dir / UNIT_NAME
    out: dict[str, Any] = {"unit": str(unit), "installed": unit.exists(),
                           "systemd": systemd_running(), "socket": _socket_state(socket)}
    if out["systemd"]:
        out["active"] = _systemctl("is-active", UNIT_NAME).stdout.strip() or "unknown"
    if out["socket"]["reachable"]:
        out["health"] = _health(socket)
    if want_json(json_out):
        print_json(out)
    else:
        sock = out["socket"]
        console.print(f"unit      {unit} ({'installed' if out['installed'] else 'not installed'})")
        if "active" in out:
            console.print(f"service   {out['active']}")
        elif not out["systemd"]:
            console.print(f"service   {systemd_problem()} (start the daemon by hand)")
        where = (f"{sock['path']} (group {sock.get('group')}, mode {sock.get('mode')})"
                 if sock["exists"] else f"{sock['path']} (missing)")
        console.print(f"socket    {where}")
        if sock["reachable"]:
            health = out.get("health") or {}
            if health.get("status_code") == 200:
                console.print(f"daemon    answers; {health.get('sandboxes')} sandboxes on "
                              "this host")
            else:
                console.print(f"daemon    refuses this user: {health.get('message', health)}")
        else:
            console.print(f"daemon    not reachable: {sock.get('problem')}")
    if not out["socket"]["reachable"]:
        if not want_json(json_out):
            note("hint: `sudo abx daemon install` sets it up; `abx doctor` shows which "
                 "engine this user gets")
        raise typer.Exit(1)
