"""``abx mcp start|stop``: run the MCP server here (STDIO or HTTP) and stop it again."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.config.settings import Settings, child_env
from agent_sandbox.surfaces.cli import runstate
from agent_sandbox.surfaces.cli.atomic import atomic_write
from agent_sandbox.surfaces.cli.fs_errors import writing
from agent_sandbox.surfaces.cli.output import CliError, UsageError, mask
from agent_sandbox.surfaces.cli.settings import cli_settings
from agent_sandbox.surfaces.cli.stdio_launch import stdio_argv

TOKEN_FILE = "mcp-token"
STARTUP_TIMEOUT = 60.0


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass
class StartPlan:
    http: bool
    host: str
    port: int
    env: dict[str, str]
    token: str | None  # what /health polling must send
    token_note: str | None  # where a generated token was saved


def _check_tools(spec: str | None) -> None:
    if spec is None:
        return
    from agent_sandbox.core.errors import SandboxError
    from agent_sandbox.surfaces.mcp.tools import resolve_allowlist

    try:
        if not resolve_allowlist(spec):
            raise UsageError("--tools selects no tool; name at least one")
    except SandboxError as exc:
        raise UsageError(f"--tools: {exc.message}") from None


def plan_start(*, http: bool, host: str, port: int, background: bool,
               auth_token_file: Path | None, generate_token: bool, template: str | None,
               tools: str | None, network_ceiling: str | None = None,
               settings: Settings | None = None) -> StartPlan:
    """What to run, and the server's environment: this run's settings (the environment,
    ./.env, ~/.abx/config) with the options given here."""
    settings = settings or cli_settings()
    if background and not http:
        raise UsageError("--background needs --http (a STDIO server belongs to the client "
                         "that spawns it): abx mcp start --http --background")
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be 1-65535, got {port}")
    if generate_token and auth_token_file:
        raise UsageError("use --generate-token or --auth-token-file, not both")
    if not http and (generate_token or auth_token_file):
        raise UsageError("--generate-token/--auth-token-file apply to --http (STDIO has no "
                         "auth: the client owns the process)")
    update: dict[str, object] = {}
    template = template or settings.mcp_template or (
        settings.default_template if "default_template" in settings.model_fields_set else None)
    if template:
        update["mcp_template"] = template
    tools = tools or settings.mcp_tools
    _check_tools(tools)
    if tools:
        update["mcp_tools"] = tools
    if network_ceiling is not None:
        from agent_sandbox.core.errors import SandboxError
        from agent_sandbox.core.network import parse

        try:
            parse(network_ceiling)
        except SandboxError as exc:
            raise UsageError(f"--network-ceiling: {exc.message}") from None
        update["mcp_network_ceiling"] = network_ceiling
    token: str | None = None
    token_note = None
    if generate_token:
        token = secrets.token_urlsafe(32)
        saved = _run_dir() / TOKEN_FILE
        with writing(saved, instead=RUNTIME_DIR_HINT):
            atomic_write(saved, (token + "\n").encode(), mode=0o600, force_mode=True)
        update.update(mcp_auth_token=token, mcp_auth_token_file=None)
        token_note = f"bearer token {mask(token)} saved in {saved} (0600)"
    elif auth_token_file:
        path = auth_token_file.expanduser().resolve()
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise UsageError(f"--auth-token-file {path}: {exc.strerror}") from None
        if not token:
            raise UsageError(f"--auth-token-file {path} is empty; put a token in it "
                             "(e.g. `openssl rand -base64 32 > FILE`)")
        update.update(mcp_auth_token=None, mcp_auth_token_file=str(path))
    elif http:
        from agent_sandbox.surfaces.mcp.http_guard import load_token

        token = load_token(settings)  # what the server will find
    if http and not is_loopback(host) and not token:
        raise UsageError(f"refusing to serve on {host} without a bearer token: anyone who can "
                         "reach the port could run commands. Add --generate-token or "
                         "--auth-token-file FILE (or set ABX_MCP_AUTH_TOKEN), or bind to "
                         "127.0.0.1")
    # The server reads its settings from its environment: built here from ours.
    env = child_env(settings.model_copy(update=update), dict(os.environ))
    return StartPlan(http=http, host=host, port=port, env=env, token=token,
                     token_note=token_note)


RUNTIME_DIR_HINT = "set ABX_MCP_RUNTIME_DIR to a writable directory"


def _run_dir() -> Path:
    """The run directory, made if missing; a failure says what to do."""
    with writing(runstate.runtime_dir(), instead=RUNTIME_DIR_HINT):
        return runstate.ensure_runtime_dir()


def _write_record(pid: int, **fields: Any) -> None:
    with writing(runstate.record_path(), instead=RUNTIME_DIR_HINT):
        runstate.write_record(pid, **fields)


def http_argv(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "agent_sandbox.surfaces.mcp.http_app:asgi_app",
            "--host", host, "--port", str(port)]


def refuse_if_running() -> None:
    rec = runstate.running_record()
    if rec:
        where = rec.get("url") or rec.get("transport", "stdio")
        raise CliError(f"an MCP server is already running (pid {rec['pid']}, {where}); "
                       "stop it first with `abx mcp stop`")


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def exec_foreground(plan: StartPlan) -> None:
    """Become the server (same pid, so the record stays right)."""
    if plan.http:
        refuse_if_running()
        argv = http_argv(plan.host, plan.port)
        _write_record(os.getpid(), transport="http", host=plan.host, port=plan.port,
                      url=f"http://{client_host(plan.host)}:{plan.port}/mcp",
                      log=None, background=False, auth=bool(plan.token))
    else:
        argv = stdio_argv()
        if runstate.running_record() is None:  # never clobber a live record
            # Only for `abx mcp status`: a client's STDIO server runs without it (a
            # read-only HOME must not keep an IDE from starting its server).
            with contextlib.suppress(OSError):
                runstate.write_record(os.getpid(), transport="stdio", background=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, plan.env)


def _health(url: str, token: str | None) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start_background(plan: StartPlan) -> dict[str, Any]:
    refuse_if_running()
    if not port_free(plan.host, plan.port):
        raise CliError(f"port {plan.port} on {plan.host} is in use; pick another with --port")
    log = _run_dir() / runstate.LOG
    with writing(log, instead=RUNTIME_DIR_HINT):
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
        out.write(f"--- abx mcp start --http {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n"
                  .encode())
        out.flush()
        proc = subprocess.Popen(http_argv(plan.host, plan.port), env=plan.env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
    base = f"http://{client_host(plan.host)}:{plan.port}"
    _write_record(proc.pid, transport="http", host=plan.host, port=plan.port,
                  url=base + "/mcp", log=str(log), background=True, auth=bool(plan.token))
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            runstate.remove_record()
            raise CliError(f"the MCP server exited during startup (code {proc.returncode}); "
                           f"last lines of {log}:\n{_tail(log)}")
        if _health(base + "/health", plan.token):
            return {"pid": proc.pid, "url": base + "/mcp", "health": base + "/health",
                    "log": str(log), "record": str(runstate.record_path()),
                    "auth": bool(plan.token)}
        time.sleep(0.2)
    proc.terminate()
    runstate.remove_record()
    raise CliError(f"the MCP server did not answer {base}/health within "
                   f"{STARTUP_TIMEOUT:.0f}s; see {log}")


def stop(timeout: float, force: bool) -> dict[str, Any]:
    rec = runstate.read_record()
    if rec is None:
        return {"stopped": False, "reason": "no MCP server is recorded"}
    pid, ticks = rec["pid"], rec.get("start_ticks")
    if not runstate.is_our_server(pid, ticks):
        runstate.remove_record()
        return {"stopped": False, "pid": pid,
                "reason": "the recorded server is not running (stale record removed)"}
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not runstate.wait_gone(pid, ticks, timeout):
        if not force:
            raise CliError(f"pid {pid} is still running {timeout:.0f}s after SIGTERM (it may "
                           "still be destroying its sandboxes); wait and retry, or run "
                           "`abx mcp stop --force` to SIGKILL it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        runstate.wait_gone(pid, ticks, 10)
    runstate.remove_record()
    return {"stopped": True, "pid": pid, "transport": rec.get("transport")}
