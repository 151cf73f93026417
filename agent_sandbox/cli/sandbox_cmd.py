"""``abx sandbox``: create, inspect, use and destroy sandboxes through the SDK."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from agent_sandbox.cli import copy_cmd, port_cmd, shell_cmd
from agent_sandbox.cli.exec_cmd import EPILOG, ExecCommand, exec_
from agent_sandbox.cli.info_view import ago, info_table
from agent_sandbox.cli.output import CliError, console, note, print_json, want_json
from agent_sandbox.cli.sdkutil import default_template, parse_pairs, provider

app = typer.Typer(help="Sandboxes: create, list, exec, copy files, pause, reset, kill.",
                  no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
IdArg = Annotated[str, typer.Argument(help="Sandbox id (see `abx sandbox list`).")]


def _sandbox(sandbox_id: str) -> Any:
    from agent_sandbox import Sandbox

    return Sandbox.connect(sandbox_id, provider=provider())


def _info_dict(info: Any) -> dict[str, Any]:
    from agent_sandbox.netpolicy import parse

    data = info.model_dump(exclude={"envs"})
    data["env_names"] = sorted(info.envs)  # values may be secrets
    data["network"] = parse(info.network).model_dump(mode="json")
    return data


def _policy(text: str, what: str = "--network") -> Any:
    """A policy given on the command line, checked before anything is made."""
    from agent_sandbox.errors import SandboxError
    from agent_sandbox.netpolicy import parse

    try:
        return parse(text)
    except SandboxError as exc:
        raise CliError(f"{what}: {exc.message}") from None


def _compact(text: str) -> Any:
    from agent_sandbox.netpolicy import compact

    return compact(_policy(text))


NETWORK_HELP = ("Outbound network: off (loopback only), registries (pip/npm/apt registries), "
                "a comma list of host names, *.wildcards and CIDRs, or full (any public "
                "address; never the host or the LAN).")


@app.command(epilog="Examples:\n\n  abx sandbox create --template base --memory-mb 512 --json"
                    "\n\n  abx sandbox create --network registries\n\n"
                    "  abx sandbox create --network 'api.openai.com,*.githubusercontent.com'")
def create(
    template: Annotated[str | None, typer.Option(help="Template (default: default_template "
                                                  "setting, else base).")] = None,
    timeout: Annotated[float, typer.Option(help="Idle seconds before auto-pause.")] = 300,
    memory_mb: Annotated[int | None, typer.Option(help="Memory limit (MiB).")] = None,
    cpu: Annotated[float | None, typer.Option(help="CPU limit (cores).")] = None,
    disk_mb: Annotated[int | None, typer.Option(help="Disk limit (MiB).")] = None,
    network: Annotated[str, typer.Option(
        "--network", metavar="POLICY", help=NETWORK_HELP)] = "off",
    persistent: Annotated[bool, typer.Option("--persistent", help="Survive MCP sessions.")]
    = False,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE, "
                                                  "repeatable.")] = None,
    metadata: Annotated[list[str] | None, typer.Option("--metadata", help="NAME=VALUE, "
                                                       "repeatable.")] = None,
    volume: Annotated[str | None, typer.Option(help="Attach a kept volume as "
                                               "/workspace.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Create and start a sandbox; prints its id. It lives until `abx sandbox kill`."""
    from agent_sandbox import Sandbox

    sb = Sandbox.create(template=template or default_template(), timeout=timeout,
                        envs=parse_pairs(env, "--env"), cpu=cpu, memory_mb=memory_mb,
                        disk_mb=disk_mb, network=_compact(network), persistent=persistent,
                        metadata=parse_pairs(metadata, "--metadata"), volume=volume,
                        provider=provider())
    if want_json(json_out):
        print_json(_info_dict(sb.info()))
    else:
        console.print(sb.sandbox_id)


@app.command("list", epilog="Example: abx sandbox list --state running")
def list_(template: Annotated[str | None, typer.Option(help="Only this template.")] = None,
          state: Annotated[str | None, typer.Option(help="running or paused.")] = None,
          json_out: JsonOpt = False) -> None:
    """List sandboxes."""
    from agent_sandbox import Sandbox

    infos = Sandbox.list(template=template, state=state, provider=provider())
    if want_json(json_out):
        print_json([_info_dict(i) for i in infos])
        return
    if not infos:
        console.print("No sandboxes. Create one with `abx sandbox create`.")
        return
    from agent_sandbox.netpolicy import parse

    table = Table("id", "template", "state", "created", "last used", "persistent", "network")
    table.columns[0].no_wrap = True
    for i in infos:
        table.add_row(i.sandbox_id, i.template, i.state, ago(i.created_at), ago(i.last_used),
                      "yes" if i.persistent else "no", Text(parse(i.network).describe()))
    console.print(table)


@app.command(epilog="Example: abx sandbox info sb-1234 --json")
def info(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Show one sandbox: state, limits, volume, timestamps."""
    data = _info_dict(_sandbox(sandbox_id).info())
    if want_json(json_out):
        print_json(data)
        return
    console.print(info_table(data))


@app.command(epilog="Examples:\n\n  abx sandbox network sbx-1234 registries\n\n"
                    "  abx sandbox network sbx-1234 'pypi.org,files.pythonhosted.org'\n\n"
                    "  abx sandbox network sbx-1234 off")
def network(sandbox_id: IdArg,
            policy: Annotated[str, typer.Argument(metavar="POLICY", help=NETWORK_HELP)],
            json_out: JsonOpt = False) -> None:
    """Change a sandbox's network policy without restarting it (running or paused: at
    once; stopped: when it boots). Connections open through the old policy are closed."""
    from agent_sandbox.netpolicy import parse

    checked = _policy(policy, "POLICY")
    sb = _sandbox(sandbox_id)
    sb.set_network(checked)
    data = _info_dict(sb.info())
    if want_json(json_out):
        print_json(data)
    else:
        console.print(f"{sandbox_id}: network {parse(data['network']).describe()}",
                      markup=False)


@app.command("port", epilog="Example: abx sandbox port sbx-1234 8000   (then open the URL)")
def port(sandbox_id: IdArg,
         number: Annotated[int, typer.Argument(min=1, max=65535, metavar="PORT",
                                               help="Where the server listens inside.")],
         json_out: JsonOpt = False) -> None:
    """Reach a server listening inside a sandbox (even with its network off): prints a URL
    and, on this machine's engine, forwards until Ctrl-C."""
    port_cmd.port(_sandbox(sandbox_id), sandbox_id, number, json_out)


app.command(name="exec", cls=ExecCommand, epilog=EPILOG)(exec_)


@app.command("run-code", epilog="Example: abx sandbox run-code sb-1234 'print(1+1)'")
def run_code(sandbox_id: IdArg,
             code: Annotated[str, typer.Argument(help="Code to run ('-' reads stdin).")],
             timeout: Annotated[float, typer.Option(help="Seconds before the cell is "
                                                    "interrupted.")] = 60,
             json_out: JsonOpt = False) -> None:
    """Run code in the sandbox's Jupyter kernel (templates with a kernel, such as
    code-interpreter-v1); exits 1 when the code raised."""
    from agent_sandbox import Sandbox

    if not hasattr(Sandbox, "run_code"):
        raise CliError("run-code is not available in this build yet (no code kernel); run "
                       f"a command instead: abx sandbox exec {sandbox_id} -- python3 -c '...'")
    if code == "-":
        code = sys.stdin.read()
    sb = _sandbox(sandbox_id)
    quiet = want_json(json_out)
    execution = sb.run_code(code, timeout=timeout,
                            on_stdout=None if quiet else _write(sys.stdout),
                            on_stderr=None if quiet else _write(sys.stderr))
    if quiet:
        print_json(execution.model_dump())
    else:
        for result in execution.results:
            if getattr(result, "is_main_result", False) and result.text is not None:
                print(result.text)
        if execution.error is not None:
            print(execution.error.traceback or f"{execution.error.name}: "
                  f"{execution.error.value}", file=sys.stderr)
    if execution.error is not None:
        raise typer.Exit(1)


def _write(stream: Any) -> Any:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


app.command(epilog="Examples:\n\n  abx sandbox upload sb-1234 ./data.csv /workspace/\n\n"
                    "  abx sandbox upload sb-1234 ./proj /workspace/proj\n\n"
                    "  abx sandbox upload sb-1234 . /workspace/proj   (the contents of .)"
            )(copy_cmd.upload)
app.command(epilog="Examples:\n\n  abx sandbox download sb-1234 /workspace/out.csv .\n\n"
                   "  abx sandbox download sb-1234 /workspace/results ./results\n\n"
                   "  abx sandbox download sb-1234 /workspace/log.txt - | tail"
            )(copy_cmd.download)


def _lifecycle(sandbox_id: str, action: str, json_out: bool, **kw: Any) -> None:
    sb = _sandbox(sandbox_id)
    getattr(sb, action)(**kw)
    if action == "kill":
        _killed(sandbox_id, sb.volume_id, kept=not kw.get("delete_volume"), json_out=json_out)
        return
    data = _info_dict(sb.info())
    if want_json(json_out):
        print_json(data)
    else:
        console.print(f"{sandbox_id}: {data['state']}")


def _killed(sandbox_id: str, volume_id: str, *, kept: bool, json_out: bool) -> None:
    if want_json(json_out):
        print_json({"sandbox_id": sandbox_id, "killed": True, "volume_id": volume_id,
                    "volume_kept": kept})
        return
    console.print(f"killed {sandbox_id}")
    if kept:
        note(f"its /workspace volume {volume_id} was kept: attach it with `abx sandbox "
             f"create --volume {volume_id}`, delete it with `abx volume rm {volume_id}`")


@app.command(epilog="Example: abx sandbox pause sb-1234")
def pause(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Freeze a sandbox's processes (files kept) to free CPU and memory."""
    _lifecycle(sandbox_id, "pause", json_out)


@app.command(epilog="Example: abx sandbox resume sb-1234")
def resume(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Resume a paused sandbox."""
    _lifecycle(sandbox_id, "resume", json_out)


@app.command(epilog="Example: abx sandbox reset sb-1234")
def reset(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Wipe every change outside /workspace (installed packages, /etc edits); keep
    /workspace."""
    _lifecycle(sandbox_id, "reset_rootfs", json_out)


@app.command(epilog="Example: abx sandbox kill sb-1234 --delete-volume")
def kill(sandbox_id: IdArg,
         delete_volume: Annotated[bool, typer.Option("--delete-volume", help="Also delete its "
                                                     "/workspace volume.")] = False,
         json_out: JsonOpt = False) -> None:
    """Destroy a sandbox. Its /workspace volume is kept (attach it to a new sandbox with
    `create --volume`) unless --delete-volume; `abx volume list` shows kept volumes and
    `abx volume rm ID` deletes one."""
    _lifecycle(sandbox_id, "kill", json_out, delete_volume=delete_volume)


app.command(epilog="Examples:\n\n  abx sandbox shell sbx-1234\n\n"
                   "  abx sandbox shell sbx-1234 --cmd 'python3'")(shell_cmd.shell)
