"""``abx snapshot``: memory snapshots of sandboxes (taken with `abx sandbox snapshot`,
started from with `abx sandbox fork`), through the SDK (this host's engine, or a gateway:
there a key sees only its own)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from agent_sandbox.surfaces.cli.output import console, print_json, want_json
from agent_sandbox.surfaces.cli.sdkutil import provider

app = typer.Typer(help="Snapshots: a sandbox's processes, memory and files at one moment: "
                       "list, inspect, rm.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
IdArg = Annotated[str, typer.Argument(help="Snapshot id (see `abx snapshot list`).")]


@app.command("list", epilog="Example: abx snapshot list --json")
def list_(json_out: JsonOpt = False) -> None:
    """List snapshots, oldest first."""
    from agent_sandbox import Sandbox

    snaps = Sandbox.list_snapshots(provider=provider())
    if want_json(json_out):
        print_json([s.model_dump() for s in snaps])
        return
    if not snaps:
        console.print("No snapshots (take one with `abx sandbox snapshot SANDBOX_ID`).")
        return
    table = Table("id", "name", "of sandbox", "template", "size", "taken")
    table.columns[0].no_wrap = True
    for s in snaps:
        table.add_row(s.snapshot_id, s.name or "-", s.sandbox_id, s.template,
                      f"{s.size_bytes / (1 << 20):.1f} MiB",
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_at)))
    console.print(table)


app.command("ls", hidden=True)(list_)


@app.command(epilog="Example: abx snapshot inspect snap-a1b2c3d4e5 --json")
def inspect(snapshot_id: IdArg, json_out: JsonOpt = False) -> None:
    """Show one snapshot: its sandbox (parent), template, size, when it was taken."""
    from agent_sandbox import Sandbox

    snap = Sandbox.snapshot_info(snapshot_id, provider=provider())
    if want_json(json_out):
        print_json(snap.model_dump())
        return
    for key, value in snap.model_dump().items():
        console.print(f"{key}: {value}")


@app.command(epilog="Example: abx snapshot rm snap-a1b2c3d4e5")
def rm(snapshot_id: IdArg, json_out: JsonOpt = False) -> None:
    """Delete a snapshot (sandboxes started from it are not affected)."""
    from agent_sandbox import Sandbox

    Sandbox.delete_snapshot(snapshot_id, provider=provider())
    if want_json(json_out):
        print_json({"snapshot_id": snapshot_id, "deleted": True})
    else:
        console.print(f"deleted {snapshot_id}")
