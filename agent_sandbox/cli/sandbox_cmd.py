"""``abx sandbox``: create, inspect, use and destroy sandboxes through the SDK."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from agent_sandbox.cli import shell_cmd
from agent_sandbox.cli.output import CliError, console, print_json, want_json
from agent_sandbox.cli.sdkutil import default_template, parse_pairs, provider

app = typer.Typer(help="Sandboxes: create, list, exec, copy files, pause, reset, kill.",
                  no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
IdArg = Annotated[str, typer.Argument(help="Sandbox id (see `abx sandbox list`).")]


def _sandbox(sandbox_id: str) -> Any:
    from agent_sandbox import Sandbox

    return Sandbox.connect(sandbox_id, provider=provider())


def _info_dict(info: Any) -> dict[str, Any]:
    data = info.model_dump(exclude={"envs"})
    data["env_names"] = sorted(info.envs)  # values may be secrets
    return data


def _ago(ts: float) -> str:
    seconds = max(0, int(time.time() - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


@app.command(epilog="Example: abx sandbox create --template base --memory-mb 512 --json")
def create(
    template: Annotated[str | None, typer.Option(help="Template (default: default_template "
                                                  "setting, else base).")] = None,
    timeout: Annotated[float, typer.Option(help="Idle seconds before auto-pause.")] = 300,
    memory_mb: Annotated[int | None, typer.Option(help="Memory limit (MiB).")] = None,
    cpu: Annotated[float | None, typer.Option(help="CPU limit (cores).")] = None,
    disk_mb: Annotated[int | None, typer.Option(help="Disk limit (MiB).")] = None,
    network: Annotated[bool, typer.Option("--network", help="Give it outbound "
                                          "network.")] = False,
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
                        disk_mb=disk_mb, network=network, persistent=persistent,
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
    table = Table("id", "template", "state", "created", "last used", "persistent", "network")
    table.columns[0].no_wrap = True
    for i in infos:
        table.add_row(i.sandbox_id, i.template, i.state, _ago(i.created_at), _ago(i.last_used),
                      "yes" if i.persistent else "no", "yes" if i.network else "no")
    console.print(table)


@app.command(epilog="Example: abx sandbox info sb-1234 --json")
def info(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Show one sandbox: state, limits, volume, timestamps."""
    data = _info_dict(_sandbox(sandbox_id).info())
    if want_json(json_out):
        print_json(data)
        return
    table = Table(show_header=False, box=None)
    for key, value in data.items():
        table.add_row(key, str(value))
    console.print(table)


@app.command(name="exec", epilog="Examples:\n\n  abx sandbox exec sb-1234 'ls -la /workspace'"
                                 "\n\n  abx sandbox exec sb-1234 -- python3 -c 'print(42)'")
def exec_(
    sandbox_id: IdArg,
    command: Annotated[list[str], typer.Argument(help="The command: one shell string, or "
                                                 "words after --.")],
    cwd: Annotated[str | None, typer.Option(help="Working directory inside.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE, "
                                                  "repeatable.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before it is killed.")] = 60,
    json_out: JsonOpt = False,
) -> None:
    """Run a command in a sandbox, streaming its output; exits with the command's exit code
    (124 when it timed out)."""
    cmd = command[0] if len(command) == 1 else shlex.join(command)
    sb = _sandbox(sandbox_id)
    quiet = want_json(json_out)

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def err(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    result = sb.commands.run(cmd, cwd=cwd, envs=parse_pairs(env, "--env"), timeout=timeout,
                             on_stdout=None if quiet else out, on_stderr=None if quiet else err)
    if quiet:
        print_json(result.model_dump())
    elif result.timed_out:
        print(f"error: timed out after {timeout:g}s (raise --timeout)", file=sys.stderr)
    raise typer.Exit(124 if result.timed_out else result.exit_code)


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


@app.command(epilog="Example: abx sandbox upload sb-1234 ./data.csv /workspace/data.csv")
def upload(sandbox_id: IdArg,
           local: Annotated[Path, typer.Argument(help="Local file ('-' for stdin).")],
           remote: Annotated[str, typer.Argument(help="Path inside the sandbox.")],
           mode: Annotated[str, typer.Option(help="Octal permissions.")] = "0644") -> None:
    """Copy a local file into a sandbox (streamed; parent directories are made)."""
    try:
        perms = int(mode, 8)
    except ValueError:
        raise CliError(f"--mode must be octal like 0644, got {mode!r}", 2) from None
    sb = _sandbox(sandbox_id)
    if str(local) == "-":
        size = sb.files.write(remote, sys.stdin.buffer, mode=perms)
    else:
        if not local.is_file():
            raise CliError(f"{local} is not a file", 2)
        with local.open("rb") as fh:
            size = sb.files.write(remote, fh, mode=perms)
    console.print(f"uploaded {size} bytes to {sandbox_id}:{remote}")


@app.command(epilog="Example: abx sandbox download sb-1234 /workspace/out.txt ./out.txt")
def download(sandbox_id: IdArg,
             remote: Annotated[str, typer.Argument(help="Path inside the sandbox.")],
             local: Annotated[Path, typer.Argument(help="Local file ('-' for stdout).")]
             ) -> None:
    """Copy a file out of a sandbox (streamed)."""
    sb = _sandbox(sandbox_id)
    chunks = sb.files.read(remote, format="stream")
    if str(local) == "-":
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        return
    tmp = local.with_name(f".{local.name}.abx-part")
    size = 0
    try:
        with tmp.open("wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                size += len(chunk)
        tmp.replace(local)
    finally:
        tmp.unlink(missing_ok=True)
    console.print(f"downloaded {size} bytes to {local}")


def _lifecycle(sandbox_id: str, action: str, json_out: bool, **kw: Any) -> None:
    sb = _sandbox(sandbox_id)
    getattr(sb, action)(**kw)
    if action == "kill":
        if want_json(json_out):
            print_json({"sandbox_id": sandbox_id, "killed": True})
        else:
            console.print(f"killed {sandbox_id}")
        return
    data = _info_dict(sb.info())
    if want_json(json_out):
        print_json(data)
    else:
        console.print(f"{sandbox_id}: {data['state']}")


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
    """Destroy a sandbox (its /workspace volume is kept unless --delete-volume)."""
    _lifecycle(sandbox_id, "kill", json_out, delete_volume=delete_volume)


app.command(epilog="Examples:\n\n  abx sandbox shell sbx-1234\n\n"
                   "  abx sandbox shell sbx-1234 --cmd 'python3'")(shell_cmd.shell)
