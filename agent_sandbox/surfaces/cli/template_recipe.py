"""``abx template build NAME --file Dockerfile``: a recipe built step by step, each step's
output streamed live (step n/m, cached or running, its time), or JSON events for scripts;
``abx template prune``: the recipe layers no template uses, removed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from agent_sandbox.remote.provider import RemoteProvider
from agent_sandbox.surfaces.cli.output import CliError, console, err_console, print_json
from agent_sandbox.surfaces.cli.sdkutil import provider, template_engine

MAX_RECIPE = 1 << 20


def build_recipe(name: str, recipe: Path, context: Path | None, quiet: bool) -> None:
    try:
        text = recipe.read_text(encoding="utf-8") if recipe.stat().st_size <= MAX_RECIPE \
            else None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the recipe {recipe}: {exc}", 2) from None
    if text is None:
        raise CliError(f"the recipe {recipe} is over {MAX_RECIPE} bytes", 2)
    where = (context or recipe.parent).resolve()
    remote = provider()
    # Through a gateway, the gateway builds (the context sent as a tar); else this host's.
    engine = remote if isinstance(remote, RemoteProvider) else template_engine("build")
    show = _json_event if quiet else _Steps().event
    info = engine.build_recipe(name, text, context=str(where), on_event=show)
    if quiet:
        _json_event({"type": "result", **info.model_dump()})  # one event a line, this too
    else:
        console.print(f"template {info.name} ready ({info.kind}); use it with "
                      f"`abx sandbox create --template {info.name}`")


def _json_event(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class _Steps:
    """Each step as a line (cached or running), its output under it, its time after."""

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "step":
            state = "[green]cached[/]" if event["cached"] else "[yellow]running[/]"
            err_console.print(f"[b]step {event['step']}/{event['of']}[/] {state} "
                              f"{escape(event['instruction'])}", highlight=False)
        elif kind == "log":
            for line in str(event["data"]).splitlines():
                err_console.print(f"  [dim]{escape(line)}[/]", highlight=False)
        elif kind == "step_done" and not event["cached"]:
            err_console.print(f"  [dim]step {event['step']} done in {event['seconds']:.1f} s[/]")
        elif kind == "done":
            err_console.print(f"[b]built in {event['seconds']:.1f} s[/]")


def prune(json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
          = False) -> None:
    """Remove the recipe layers no template uses (a template's own and its parents' stay)."""
    layers, freed = template_engine("prune").prune_layers()
    if json_out:
        print_json({"layers": layers, "bytes": freed})
    else:
        console.print(f"removed {layers} unused layer(s), {freed / (1 << 20):.1f} MiB")
