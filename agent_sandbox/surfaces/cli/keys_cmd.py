"""``abx keys``: the gateway's API keys (hashed at rest; a key is shown once, at creation)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from agent_sandbox.surfaces.cli.output import console, err_console, print_json, want_json
from agent_sandbox.surfaces.cli.settings import cli_settings

app = typer.Typer(help="API keys of the gateway (`abx serve`): create, list, revoke.",
                  no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
KeysFile = Annotated[Path | None, typer.Option(
    "--api-keys-file", help="The key database (default $ABX_GATEWAY_KEYS_FILE, else "
    "$ABX_DATA_DIR/gateway-keys.db; created mode 0600).")]


def _ceiling(value: object) -> str:
    """A key's network ceiling as a person reads it."""
    if value is None:
        return "the gateway's"
    from agent_sandbox.core.network import parse

    return parse(value).describe()


@app.command(epilog="Examples:\n\n  abx keys create --name ci --max-sandboxes 5\n\n"
                    "  abx keys create --name agents --network registries")
def create(
    name: Annotated[str, typer.Option("--name", help="Who or what the key is for.")],
    admin: Annotated[bool, typer.Option("--admin", help="May see and manage every tenant's "
                                        "sandboxes, and read /metrics.")] = False,
    max_sandboxes: Annotated[int | None, typer.Option(
        help="Live sandboxes at once (default $ABX_GATEWAY_MAX_SANDBOXES, else 50).")] = None,
    max_commands: Annotated[int | None, typer.Option(
        help="Concurrent commands (default $ABX_GATEWAY_MAX_COMMANDS or 32).")] = None,
    network: Annotated[str | None, typer.Option(
        "--network", metavar="POLICY", help="The key's network ceiling: the most network its "
        "sandboxes may have (off, registries, a comma list of names/*.wildcards/CIDRs, "
        "full; default: the gateway's, $ABX_GATEWAY_NETWORK_CEILING).")] = None,
    e2b: Annotated[bool, typer.Option("--e2b", help="Shape the secret like an E2B key "
                                      "(e2b_ and 40 hex digits), for E2B SDKs that check "
                                      "it; see docs/e2b.md.")] = False,
    api_keys_file: KeysFile = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a key. Its secret is printed this once and never again (only a hash is kept)."""
    from agent_sandbox.surfaces.gateway.cli import keys_create

    key = keys_create(name, admin=admin, max_sandboxes=max_sandboxes,
                      max_commands=max_commands, network=network, e2b=e2b,
                      api_keys_file=api_keys_file,
                      settings=cli_settings())
    if want_json(json_out):
        print_json(key)
        return
    err_console.print(f"created API key {key['id']} ({key['name']}"
                      f"{', admin' if key['admin'] else ''}; max {key['max_sandboxes']} "
                      f"sandboxes, {key['max_commands']} commands; network ceiling: "
                      f"{_ceiling(key['network_ceiling'])}). Save the secret now: it is not "
                      "shown again.", markup=False)
    # The secret alone on stdout: `KEY=$(abx keys create --name x)` works.
    print(key["token"])


@app.command("list", epilog="Example: abx keys list --json")
def list_(api_keys_file: KeysFile = None, json_out: JsonOpt = False) -> None:
    """List keys (never their secrets)."""
    from agent_sandbox.surfaces.gateway.cli import keys_list

    keys = keys_list(api_keys_file, cli_settings())
    if want_json(json_out):
        print_json(keys)
        return
    if not keys:
        err_console.print("no API keys yet; create one with `abx keys create --name NAME`")
        return
    table = Table("id", "name", "admin", "created", "state", "max sandboxes", "max commands",
                  "network ceiling")
    for k in keys:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(k["created_at"])))  # type: ignore[arg-type]
        table.add_row(str(k["id"]), str(k["name"]), "yes" if k["admin"] else "",
                      created, "revoked" if k["revoked"] else "live",
                      str(k["max_sandboxes"]), str(k["max_commands"]),
                      _ceiling(k["network_ceiling"]))
    console.print(table)


@app.command(epilog="Example: abx keys revoke key-0123456789ab")
def revoke(key: Annotated[str, typer.Argument(help="Key id (or name).")],
           api_keys_file: KeysFile = None, json_out: JsonOpt = False) -> None:
    """Revoke a key: a running gateway refuses it (401) from its next request on."""
    from agent_sandbox.surfaces.gateway.cli import keys_revoke

    out = keys_revoke(key, api_keys_file, cli_settings())
    if want_json(json_out):
        print_json(out)
    else:
        console.print(f"revoked API key {out['id']} ({out['name']})")
