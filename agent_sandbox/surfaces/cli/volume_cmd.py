"""``abx volume``: the /workspace volumes sandboxes leave behind, through the SDK (this
host's engine, or a gateway: there a key sees only its own)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from agent_sandbox.surfaces.cli.output import console, err_console, print_json, want_json
from agent_sandbox.surfaces.cli.sdkutil import provider

app = typer.Typer(help="Volumes: the /workspace of killed sandboxes, kept until deleted: "
                       "list, inspect, rm.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
IdArg = Annotated[str, typer.Argument(help="Volume id (see `abx volume list`).")]


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _size(mb: int) -> str:
    return f"{mb / 1024:g} GiB" if mb >= 1024 and mb % 1024 == 0 else f"{mb} MiB"


@app.command("list", epilog="Example: abx volume list --json")
def list_(kept: Annotated[bool, typer.Option("--kept", help="Only volumes no sandbox "
                                             "uses.")] = False,
          json_out: JsonOpt = False) -> None:
    """List volumes: the ones sandboxes use, and the ones kept after `abx sandbox kill`."""
    from agent_sandbox import Volume

    volumes = [v for v in Volume.list(provider=provider()) if not (kept and v.attached_to)]
    if want_json(json_out):
        print_json([v.model_dump() for v in volumes])
        return
    if not volumes:
        console.print("No kept volumes." if kept else "No volumes.")
        return
    owners = any(v.owner for v in volumes)
    table = Table("id", "size limit", "created", "used by", *(["owner"] if owners else []))
    table.columns[0].no_wrap = True
    for v in volumes:
        table.add_row(v.volume_id, _size(v.size_mb), _when(v.created_at),
                      v.attached_to or "- (kept)", *([v.owner or "-"] if owners else []))
    console.print(table)


@app.command(epilog="Example: abx volume inspect vol-1a2b3c4d5e --json")
def inspect(volume_id: IdArg, json_out: JsonOpt = False) -> None:
    """Show one volume: size limit, when it was made, which sandbox uses it."""
    from agent_sandbox import Volume

    volume = Volume.inspect(volume_id, provider=provider())
    if want_json(json_out):
        print_json(volume.model_dump())
        return
    table = Table(show_header=False, box=None)
    table.add_row("volume_id", volume.volume_id)
    table.add_row("size limit", _size(volume.size_mb))
    table.add_row("created", _when(volume.created_at))
    table.add_row("used by", volume.attached_to or "- (kept: no sandbox uses it)")
    if volume.owner:
        table.add_row("owner", volume.owner)
    console.print(table)
    if not volume.attached_to:
        err_console.print(f"Attach it with `abx sandbox create --volume {volume_id}`; "
                          f"delete it with `abx volume rm {volume_id}`.")


@app.command("rm", epilog="Example: abx volume rm vol-1a2b3c4d5e vol-6f7g8h9i0j")
def rm(volume_ids: Annotated[list[str], typer.Argument(help="Volume ids.")],
       json_out: JsonOpt = False) -> None:
    """Delete kept volumes and their files (one a sandbox uses is refused: kill the
    sandbox first)."""
    from agent_sandbox import Volume
    from agent_sandbox.core.errors import SandboxError, WrongStateError

    p = provider()
    report: list[dict[str, Any]] = []
    for volume_id in volume_ids:
        try:
            Volume.delete(volume_id, provider=p)
        except WrongStateError as exc:
            report.append({"volume_id": volume_id, "deleted": False,
                           "error": f"{exc.message}; kill that sandbox first (`abx "
                                    "sandbox kill`), or keep the volume"})
        except SandboxError as exc:
            report.append({"volume_id": volume_id, "deleted": False, "error": exc.message})
        else:
            report.append({"volume_id": volume_id, "deleted": True})
    if want_json(json_out):
        print_json(report)
    else:
        for item in report:
            if item["deleted"]:
                console.print(f"deleted {item['volume_id']}")
            else:
                err_console.print(f"error: {item['error']}")
    if not all(item["deleted"] for item in report):
        raise typer.Exit(1)
