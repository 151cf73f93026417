"""``abx sandbox``: create, inspect, use and destroy sandboxes through the SDK."""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from agent_sandbox.core.code_languages import LANGUAGES
from agent_sandbox.surfaces.cli import cell_output, copy_cmd, port_cmd, shell_cmd
from agent_sandbox.surfaces.cli.exec_cmd import EPILOG, ExecCommand, exec_
from agent_sandbox.surfaces.cli.info_view import ago, info_table, size
from agent_sandbox.surfaces.cli.output import CliError, console, note, print_json, want_json
from agent_sandbox.surfaces.cli.sdkutil import connect, default_template, parse_pairs, provider

app = typer.Typer(help="Sandboxes: create, list, exec, copy files, pause, reset, kill.",
                  no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
IdArg = Annotated[str, typer.Argument(help="Sandbox id (see `abx sandbox list`).")]


def _sandbox(sandbox_id: str) -> Any:
    return connect(sandbox_id)


def _info_dict(info: Any) -> dict[str, Any]:
    from agent_sandbox.core.network import parse

    data = info.model_dump(exclude={"envs"})
    data["env_names"] = sorted(info.envs)  # values may be secrets
    data["network"] = parse(info.network).model_dump(mode="json")
    return data


def _policy(text: str, what: str = "--network") -> Any:
    """A policy given on the command line, checked before anything is made."""
    from agent_sandbox.core.errors import SandboxError
    from agent_sandbox.core.network import parse

    try:
        return parse(text)
    except SandboxError as exc:
        raise CliError(f"{what}: {exc.message}") from None


def _compact(text: str) -> Any:
    from agent_sandbox.core.network import compact

    return compact(_policy(text))


# How each create option of core.spec.CreateSpec is spelled on the command line where it
# is not simply --its-name; a new option is an option here by itself.
PAIRS = {"envs": ("--env", "-e"), "metadata": ("--metadata",)}
NETWORK_HELP = ("Outbound network: off (loopback only), registries (pip/npm/apt registries), "
                "a comma list of host names, *.wildcards and CIDRs, or full (any public "
                "address; never the host or the LAN).")
CLI_TEXT = {"template": "Template (default: the default_template setting, else base).",
            "network": NETWORK_HELP}


def _create_parameters() -> list[inspect.Parameter]:
    """``abx sandbox create``'s options, one per create option of the spec."""
    from agent_sandbox.core.spec import CreateSpec

    params = []
    for name, info in CreateSpec.model_fields.items():
        text = CLI_TEXT.get(name) or f"{(info.description or name)[:1].upper()}" \
            f"{(info.description or name)[1:]}."
        default = info.get_default(call_default_factory=True)
        flag = "--" + name.replace("_", "-")
        if name in PAIRS:
            kind: Any = Annotated[list[str] | None, typer.Option(
                *PAIRS[name], help="NAME=VALUE, repeatable: " + text)]
            default = None
        elif name == "network":
            kind, default = Annotated[str, typer.Option(flag, metavar="POLICY", help=text)], "off"
        elif name == "secrets":
            kind, default = Annotated[list[str] | None, typer.Option(
                flag, metavar="NAME", help=text + " Repeatable (abx secrets list).")], None
        elif isinstance(default, bool):  # a flag that turns the default around
            names = flag if not default else f"{flag}/--no-{flag[2:]}"
            kind = Annotated[bool, typer.Option(names, help=text)]
        elif name == "template":
            kind, default = Annotated[str | None, typer.Option(flag, help=text)], None
        else:
            plain = info.annotation if default is not None else info.annotation | None
            kind = Annotated[plain, typer.Option(flag, help=text)]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=kind))
    params.append(inspect.Parameter("json_out", inspect.Parameter.KEYWORD_ONLY, default=False,
                                    annotation=JsonOpt))
    return params


def create(**given: Any) -> None:
    """Create and start a sandbox; prints its id. It lives until `abx sandbox kill`."""
    from agent_sandbox import Sandbox

    json_out = given.pop("json_out")
    options = {name: value for name, value in given.items() if value is not None}
    for name, (flag, *_) in PAIRS.items():
        if name in options:
            options[name] = parse_pairs(options[name], flag)
    options["network"] = _compact(options.get("network", "off"))
    if "snapshot" not in options:  # a fork is its snapshot's template
        options["template"] = options.get("template") or default_template()
    sb = Sandbox.create(**options, provider=provider())
    if want_json(json_out):
        print_json(_info_dict(sb.info()))
    else:
        console.print(sb.sandbox_id)


create.__signature__ = inspect.Signature(_create_parameters())  # type: ignore[attr-defined]
app.command(epilog="Examples:\n\n  abx sandbox create --template base --memory-mb 512 --json"
                   "\n\n  abx sandbox create --network registries\n\n"
                   "  abx sandbox create --network 'api.openai.com,*.githubusercontent.com'"
            )(create)


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
    from agent_sandbox.core.network import parse

    table = Table("id", "template", "state", "created", "last used", "persistent", "network")
    table.columns[0].no_wrap = True
    for i in infos:
        table.add_row(i.sandbox_id, i.template, i.state, ago(i.created_at), ago(i.last_used),
                      "yes" if i.persistent else "no", Text(parse(i.network).describe()))
    console.print(table)


@app.command(epilog="Example: abx sandbox info sbx-a1b2c3d4e5 --json")
def info(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Show one sandbox: state, limits, use (CPU, memory, disk), volume, timestamps."""
    sandbox = _sandbox(sandbox_id)
    data = _info_dict(sandbox.info())
    data["usage"] = _latest(sandbox) if data["state"] == "running" else None
    if want_json(json_out):
        print_json(data)
        return
    console.print(info_table(data))


def _latest(sandbox: Any) -> dict[str, Any] | None:
    """Its latest metrics sample (None where the backend reads none)."""
    from agent_sandbox.core.errors import RuntimeUnavailableError

    try:
        samples = sandbox.get_metrics()
    except RuntimeUnavailableError:
        return None
    return samples[-1].model_dump() if samples else None


@app.command(epilog="Example: abx sandbox logs sbx-a1b2c3d4e5")
def logs(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Its log, oldest first: what happened to it and its start command's output (kept by
    the process serving it: a gateway's are complete, a local engine's only its own)."""
    import datetime

    from agent_sandbox.surfaces.cli.copy_cmd import safe  # the sandbox wrote them

    entries = _sandbox(sandbox_id).get_logs()
    if want_json(json_out):
        print_json([e.model_dump() for e in entries])
        return
    for e in entries:
        at = datetime.datetime.fromtimestamp(e.timestamp).isoformat(timespec="seconds")
        console.print(f"{at} {e.level:<5} {e.source:<9} {safe(e.message)}", markup=False,
                      highlight=False)


@app.command(epilog="Example: abx sandbox top --json")
def top(json_out: JsonOpt = False) -> None:
    """Running sandboxes by memory used, with their CPU and disk (read now)."""
    from agent_sandbox import Sandbox

    found = []
    for i in Sandbox.list(state="running", provider=provider()):
        sample = _latest(Sandbox.connect(i.sandbox_id, provider=provider()))
        if sample is not None:
            found.append({"sandbox_id": i.sandbox_id, "template": i.template, **sample})
    found.sort(key=lambda m: -m["mem_used"])
    if want_json(json_out):
        print_json(found)
        return
    if not found:
        console.print("No running sandbox with metrics (the runc backend reads them).")
        return
    table = Table("id", "template", "cpu", "memory", "disk")
    for m in found:
        table.add_row(m["sandbox_id"], m["template"], f"{m['cpu_used_pct']:g}%",
                      f"{size(m['mem_used'])} / {size(m['mem_total'])}",
                      f"{size(m['disk_used'])} / {size(m['disk_total'])}")
    console.print(table)


@app.command(epilog="Examples:\n\n  abx sandbox network sbx-a1b2c3d4e5 registries\n\n"
                    "  abx sandbox network sbx-a1b2c3d4e5 'pypi.org,files.pythonhosted.org'\n\n"
                    "  abx sandbox network sbx-a1b2c3d4e5 off")
def network(sandbox_id: IdArg,
            policy: Annotated[str, typer.Argument(metavar="POLICY", help=NETWORK_HELP)],
            json_out: JsonOpt = False) -> None:
    """Change a sandbox's network policy without restarting it (running or paused: at
    once; stopped: when it boots). Connections open through the old policy are closed."""
    from agent_sandbox.core.network import parse

    checked = _policy(policy, "POLICY")
    sb = _sandbox(sandbox_id)
    sb.set_network(checked)
    data = _info_dict(sb.info())
    if want_json(json_out):
        print_json(data)
    else:
        console.print(f"{sandbox_id}: network {parse(data['network']).describe()}",
                      markup=False)


@app.command("port", epilog="Example: abx sandbox port sbx-a1b2c3d4e5 8000   (then open the URL)")
def port(sandbox_id: IdArg,
         number: Annotated[int, typer.Argument(min=1, max=65535, metavar="PORT",
                                               help="Where the server listens inside.")],
         share: Annotated[bool, typer.Option(
             "--share", help="Print a share link a browser can open (a gateway's: a token "
                             "that expires, revocable with `abx sandbox unshare`).")] = False,
         public: Annotated[bool, typer.Option(
             "--public", help="With --share: no token (where the operator allows "
                              "it).")] = False,
         expires_in: Annotated[float | None, typer.Option(
             "--expires-in", metavar="SECONDS", help="With --share: how long it works "
                                                     "(default a day).")] = None,
         json_out: JsonOpt = False) -> None:
    """Reach a server listening inside a sandbox (even with its network off): prints a URL
    and, on this machine's engine, forwards until Ctrl-C; or, with --share, prints a link
    for a browser."""
    if share or public:
        link = _sandbox(sandbox_id).share_port(number, public=public, expires_in=expires_in)
        if want_json(json_out):
            print_json(link.model_dump())
        else:
            console.print(f"{link.url}  (share {link.share_id}, until "
                          f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(link.expires_at))})",
                          markup=False, highlight=False)
        return
    port_cmd.port(_sandbox(sandbox_id), sandbox_id, number, json_out)


@app.command("unshare", epilog="Example: abx sandbox unshare sbx-a1b2c3d4e5 shr-0123456789abcdef")
def unshare(sandbox_id: IdArg,
            share_ids: Annotated[list[str], typer.Argument(help="Share link ids (from "
                                                           "`abx sandbox port --share`).")]
            ) -> None:
    """Revoke share links: each stops working at once."""
    sb = _sandbox(sandbox_id)
    for share_id in share_ids:
        sb.revoke_share(share_id)
        console.print(f"Revoked {share_id}.", markup=False)


app.command(name="exec", cls=ExecCommand, epilog=EPILOG)(exec_)


@app.command("run-code", epilog="Examples:\n\n  abx sandbox run-code sbx-a1b2c3d4e5 'print(1+1)'"
                                "\n\n  abx sandbox run-code sbx-a1b2c3d4e5 --save-dir plots "
                                "'import matplotlib.pyplot as plt; plt.plot([1, 3, 2])'"
                                "\n\n  abx sandbox run-code sbx-a1b2c3d4e5 --language js "
                                "'[1, 2].map((x) => x * 2)'")
def run_code(sandbox_id: IdArg,
             code: Annotated[str, typer.Argument(help="Code to run ('-' reads stdin).")],
             timeout: Annotated[float, typer.Option(help="Seconds before the cell is "
                                                    "interrupted.")] = 60,
             language: Annotated[str | None, typer.Option(
                 "--language", "-l", help="The cell's language: "
                 f"{', '.join(LANGUAGES)} (default python); each has its own default "
                 "context.")] = None,
             save_dir: Annotated[Path | None, typer.Option(
                 "--save-dir", metavar="DIR", help="Save the cell's images (a figure, "
                 "display() of one: png, jpeg, svg, pdf) in DIR as image-1.png, image-2.png "
                 "...; made if missing, nothing in it replaced.")] = None,
             json_out: JsonOpt = False) -> None:
    """Run code in the sandbox's Jupyter kernel (templates with a kernel, such as
    code-interpreter-v1): prints its output and the text of its results, saves its images
    with --save-dir; exits 1 when the code raised."""
    from agent_sandbox import Sandbox

    if not hasattr(Sandbox, "run_code"):
        raise CliError("run-code is not available in this build yet (no code kernel); run "
                       f"a command instead: abx sandbox exec {sandbox_id} -- python3 -c '...'")
    if code == "-":
        code = sys.stdin.read()
    sb = _sandbox(sandbox_id)
    quiet = want_json(json_out)
    execution = sb.run_code(code, timeout=timeout, language=language,
                            on_stdout=None if quiet else _write(sys.stdout),
                            on_stderr=None if quiet else _write(sys.stderr))
    if quiet:
        print_json(execution.model_dump())
        if save_dir is not None:
            cell_output.show(execution.results, save_dir, texts=False)
    else:
        cell_output.show(execution.results, save_dir)
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


app.command(epilog="Examples:\n\n  abx sandbox upload sbx-a1b2c3d4e5 ./data.csv /workspace/\n\n"
                    "  abx sandbox upload sbx-a1b2c3d4e5 ./proj /workspace/proj\n\n"
                    "  abx sandbox upload sbx-a1b2c3d4e5 . /workspace/proj   (the contents of .)"
            )(copy_cmd.upload)
app.command(epilog="Examples:\n\n  abx sandbox download sbx-a1b2c3d4e5 /workspace/out.csv .\n\n"
                   "  abx sandbox download sbx-a1b2c3d4e5 /workspace/results ./results\n\n"
                   "  abx sandbox download sbx-a1b2c3d4e5 /workspace/log.txt - | tail"
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


@app.command(epilog="Example: abx sandbox pause sbx-a1b2c3d4e5")
def pause(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Pause a sandbox to free CPU and memory: its processes and memory are checkpointed
    to disk where the host has CRIU (else frozen), its files kept."""
    _lifecycle(sandbox_id, "pause", json_out)


@app.command(epilog="Example: abx sandbox snapshot sbx-a1b2c3d4e5 --name before-upgrade")
def snapshot(sandbox_id: IdArg,
             name: Annotated[str | None, typer.Option("--name", help="Your label for "
                                                      "it.")] = None,
             json_out: JsonOpt = False) -> None:
    """Snapshot a sandbox: its processes, memory and files now (it runs on). `abx sandbox
    fork SNAPSHOT_ID` starts copies of it; `abx snapshot list` shows them."""
    snap = _sandbox(sandbox_id).snapshot(name)
    if want_json(json_out):
        print_json(snap.model_dump())
    else:
        console.print(snap.snapshot_id)


@app.command(epilog="Example: abx sandbox fork snap-a1b2c3d4e5 --count 4")
def fork(snapshot_id: Annotated[str, typer.Argument(help="Snapshot id (see `abx snapshot "
                                                     "list`).")],
         count: Annotated[int, typer.Option("--count", "-n", min=1, max=64,
                                            help="How many copies, started at once.")] = 1,
         json_out: JsonOpt = False) -> None:
    """Start sandboxes from a snapshot (each its own copy of its processes, memory and
    files); prints their ids."""
    from concurrent.futures import ThreadPoolExecutor

    from agent_sandbox import Sandbox

    where = provider()
    with ThreadPoolExecutor(min(count, 8)) as pool:
        made = list(pool.map(lambda _: Sandbox.create(snapshot=snapshot_id, provider=where),
                             range(count)))
    if want_json(json_out):
        print_json([_info_dict(sb.info()) for sb in made])
    else:
        for sb in made:
            console.print(sb.sandbox_id)


@app.command(epilog="Example: abx sandbox resume sbx-a1b2c3d4e5")
def resume(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Resume a paused sandbox."""
    _lifecycle(sandbox_id, "resume", json_out)


@app.command(epilog="Example: abx sandbox reset sbx-a1b2c3d4e5")
def reset(sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Wipe every change outside /workspace (installed packages, /etc edits); keep
    /workspace."""
    _lifecycle(sandbox_id, "reset_rootfs", json_out)


@app.command(epilog="Example: abx sandbox kill sbx-a1b2c3d4e5 --delete-volume")
def kill(sandbox_id: IdArg,
         delete_volume: Annotated[bool, typer.Option("--delete-volume", help="Also delete its "
                                                     "/workspace volume.")] = False,
         json_out: JsonOpt = False) -> None:
    """Destroy a sandbox. Its /workspace volume is kept (attach it to a new sandbox with
    `create --volume`) unless --delete-volume; `abx volume list` shows kept volumes and
    `abx volume rm ID` deletes one."""
    _lifecycle(sandbox_id, "kill", json_out, delete_volume=delete_volume)


app.command(epilog="Examples:\n\n  abx sandbox shell sbx-a1b2c3d4e5\n\n"
                   "  abx sandbox shell sbx-a1b2c3d4e5 --cmd 'python3'")(shell_cmd.shell)
