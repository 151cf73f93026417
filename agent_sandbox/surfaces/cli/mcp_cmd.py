"""``abx mcp``: install into MCP clients, run, stop, inspect and deploy the MCP server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from agent_sandbox.surfaces.cli import mcp_install, mcp_server, runstate
from agent_sandbox.surfaces.cli.clients import SERVER_NAME, TARGETS
from agent_sandbox.surfaces.cli.output import console, note, print_json, want_json
from agent_sandbox.surfaces.cli.settings import cli_settings
from agent_sandbox.surfaces.mcp.banner import auth_configured

app = typer.Typer(help="The MCP server: install it into AI clients, run it, stop it, deploy it.",
                  no_args_is_help=True)

TARGET_HELP = f"MCP client: {', '.join(TARGETS)}"
TargetOpt = Annotated[str, typer.Option("--target", "-t", help=TARGET_HELP)]
ScopeOpt = Annotated[str | None, typer.Option(
    "--scope", help="user or project (where the client has both; default: the client's usual "
    "one — project for vscode, user otherwise)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.command(epilog="Example: abx mcp install --target cursor   (it prints what is left "
                    "to do in that client, e.g. restart it)")
def install(target: TargetOpt, scope: ScopeOpt = None, json_out: JsonOpt = False) -> None:
    """Add the agent-sandbox server (`abx mcp start`) to a client's MCP config.

    Other servers and keys in the file are kept; a file that is not strict JSON (or valid
    TOML, for codex) is refused and left untouched. The old file is backed up next to it
    (*.abx-backup). Cursor/Claude user configs get the API key in an env block when one
    resolves; the VS Code workspace file never does.
    """
    result = mcp_install.install(target, scope)
    if want_json(json_out):
        print_json(result)
        return
    if result["changed"]:
        console.print(f"Installed [b]{SERVER_NAME}[/b] for {result['target']} "
                      f"({result['scope']}) in {result['path']}")
        if result["backup"]:
            console.print(f"  previous file saved as {result['backup']}")
    else:
        console.print(f"{SERVER_NAME} is already installed in {result['path']} (unchanged)")
    console.print(f"  command: {' '.join(result['command'])}")
    if result["env"]:
        console.print(f"  env: {', '.join(result['env'])}")
    console.print("Next:")
    for step in result["next"]:
        console.print(f"  - {step}.", markup=False, soft_wrap=True)


@app.command(epilog="Example: abx mcp uninstall --target vscode")
def uninstall(target: TargetOpt, scope: ScopeOpt = None, json_out: JsonOpt = False) -> None:
    """Remove only our entry from a client's MCP config; everything else is kept."""
    result = mcp_install.uninstall(target, scope)
    if want_json(json_out):
        print_json(result)
    elif result["removed"]:
        console.print(f"Removed {SERVER_NAME} from {result['path']}")
    else:
        console.print(f"{SERVER_NAME} was not installed in {result['path']} (nothing to do)")


def _status() -> dict[str, Any]:
    from agent_sandbox.core.errors import SandboxError
    from agent_sandbox.surfaces.mcp.tools import resolve_allowlist

    rec = runstate.running_record()
    settings = cli_settings()
    spec = settings.mcp_tools
    try:
        tools = [t.name for t in resolve_allowlist(spec)]
    except SandboxError as exc:
        tools = [f"<invalid ABX_MCP_TOOLS: {exc.message}>"]
    auth = auth_configured(settings) or bool(rec and rec.get("auth"))
    data: dict[str, Any] = {
        "server": SERVER_NAME,
        "transport": rec.get("transport", "stdio") if rec else "stdio",
        "tools": tools,
        "network_ceiling": settings.mcp_ceiling.describe(),
        "auth_configured": auth,
        "api_key_configured": bool(settings.sandbox_api_key),
        **mcp_install.installed_flags(),
        "mcp_running": rec is not None,
        "pid": rec["pid"] if rec else None,
        "url": rec.get("url") if rec else None,
        "log": rec.get("log") if rec else None,
        "runtime_dir": str(runstate.runtime_dir()),
    }
    return data


@app.command(epilog="Example: abx mcp status --json")
def status(json_out: JsonOpt = False) -> None:
    """Show the server name, transport, tools, auth, which clients have it, and whether the
    local server recorded by `abx mcp start` is running."""
    data = _status()
    if want_json(json_out):
        print_json(data)
        return
    table = Table(show_header=False, box=None)
    for key, value in data.items():
        if isinstance(value, list):
            value = ", ".join(value)
        elif isinstance(value, bool):
            value = "[green]yes[/green]" if value else "no"
        elif value is None:
            value = "-"
        table.add_row(key, str(value))
    console.print(table)


@app.command(epilog="Examples:\n\n  abx mcp start\n\n  abx mcp start --http --background"
                    "\n\n  abx mcp start --http --host 0.0.0.0 --generate-token")
def start(
    http: Annotated[bool, typer.Option("--http", help="Serve Streamable HTTP instead of "
                                       "STDIO.")] = False,
    host: Annotated[str, typer.Option(help="HTTP bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port.")] = 9000,
    background: Annotated[bool, typer.Option("--background", help="With --http: start it, "
                                             "print pid/URL/log, and return.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors "
                                        "(and the pid with --background).")] = False,
    auth_token_file: Annotated[Path | None, typer.Option(
        "--auth-token-file", help="Bearer token file (HTTP); passed to the server by "
        "path.")] = None,
    generate_token: Annotated[bool, typer.Option(
        "--generate-token", help="Make a random bearer token (HTTP), saved 0600 in the "
        "runtime dir.")] = False,
    template: Annotated[str | None, typer.Option(help="Template of the sandboxes the server "
                                                  "creates.")] = None,
    tools: Annotated[str | None, typer.Option(help="Tool allowlist: names or presets, comma "
                                               "separated (e.g. read-only).")] = None,
    network_ceiling: Annotated[str | None, typer.Option(
        "--network-ceiling", metavar="POLICY", help="The most network the model may give a "
        "sandbox (off, registries, a comma list of names/*.wildcards/CIDRs, full; default "
        "$ABX_MCP_NETWORK_CEILING, else registries).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the MCP server: STDIO in the foreground (what IDEs spawn), or Streamable HTTP.

    Secrets (API key, token) reach the server through its environment only. pid and log
    live in ~/.abx/run (or ABX_MCP_RUNTIME_DIR); `abx mcp stop` ends it. Binding beyond
    loopback needs a token.
    """
    plan = mcp_server.plan_start(http=http, host=host, port=port, background=background,
                                 auth_token_file=auth_token_file,
                                 generate_token=generate_token, template=template, tools=tools,
                                 network_ceiling=network_ceiling)
    if not background:
        if plan.token_note and not quiet:
            note(plan.token_note)
        mcp_server.exec_foreground(plan)
        return
    result = mcp_server.start_background(plan)
    if want_json(json_out):
        print_json(result)
        return
    if quiet:
        console.print(str(result["pid"]))
        return
    console.print(f"MCP server started (pid {result['pid']})")
    console.print(f"  url:  {result['url']}")
    console.print(f"  log:  {result['log']}")
    if plan.token_note:
        console.print(f"  auth: {plan.token_note}")
    elif not result["auth"]:
        console.print("  auth: none (loopback only)")
    console.print("Stop it with: abx mcp stop")


@app.command(epilog="Example: abx mcp stop")
def stop(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for it to exit.")] = 45.0,
    force: Annotated[bool, typer.Option("--force", help="SIGKILL it if SIGTERM did not end "
                                        "it in time.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Stop the server `abx mcp start` recorded: SIGTERM (only if that pid is still our
    server), wait until it has destroyed its sandboxes and exited, remove the record."""
    result = mcp_server.stop(timeout, force)
    if want_json(json_out):
        print_json(result)
    elif result["stopped"]:
        console.print(f"Stopped the MCP server (pid {result['pid']}).")
    else:
        console.print(f"Nothing to stop: {result['reason']}.")


def _register_deploy() -> None:
    from agent_sandbox.surfaces.cli.deploy import deploy

    app.command(epilog="Examples:\n\n  abx mcp deploy --target fc --generate-token "
                       "--api-key $ABX_SANDBOX_API_KEY --output-dir ./mcp-artifact\n\n"
                       "  abx mcp deploy --target kubernetes-gateway --namespace "
                       "agent-sandbox --output-dir ./gateway")(deploy)


_register_deploy()
