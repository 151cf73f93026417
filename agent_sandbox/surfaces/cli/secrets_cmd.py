"""``abx secrets``: credentials sandboxes use but never see (docs/secrets.md), through the
SDK (this host's engine: yours alone; or a gateway: your key's). A value is read from a
file or stdin, never from the command line (other users can read a process's argv), and
never printed again."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from agent_sandbox.surfaces.cli.output import console, print_json, want_json
from agent_sandbox.surfaces.cli.sdkutil import provider

app = typer.Typer(help="Secrets: values sandboxes may send to named hosts without seeing "
                       "them: create, list, rm.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.command(epilog="Example: abx secrets create gh --value-file token.txt --host "
                    "api.github.com --header Authorization --format 'Bearer {}'")
def create(
        name: Annotated[str, typer.Argument(help="Its name (a-z, 0-9, _ and -).")],
        value_file: Annotated[str, typer.Option(
            "--value-file", help="File holding the value (its first line); - reads stdin.")],
        host: Annotated[list[str], typer.Option(
            "--host", help="A host it may be sent to (host or host:port; 443 unless "
                           "given); repeat for more.")],
        header: Annotated[str, typer.Option(help="The header that carries it.")] = "Authorization",
        format: Annotated[str | None, typer.Option(  # noqa: A002 - the issue's option name
            "--format", help="The header's value, {} the secret (default: 'Bearer {}' for "
                             "Authorization, else '{}').")] = None,
        basic: Annotated[bool, typer.Option(
            "--basic", help="The value is user:password, sent as HTTP basic auth.")] = False,
        query: Annotated[str | None, typer.Option(
            help="Send it as this query parameter instead of a header.")] = None,
        env: Annotated[str, typer.Option(
            help="The variable holding its placeholder in the sandbox (default "
                 "NAME_TOKEN).")] = "",
        inject: Annotated[bool, typer.Option(
            "--inject", help="Set the header on every request to its hosts, placeholder or "
                             "not (what E2B's network.rules transforms need).")] = False,
        replace: Annotated[bool, typer.Option(help="Replace a secret of that name.")] = False,
        json_out: JsonOpt = False) -> None:
    """Store a secret and the rule of where it may go. Sandboxes made with `--secrets
    NAME` see only `abx-secret:NAME`; their proxy sends the value."""
    from agent_sandbox import Secret

    raw = sys.stdin.read() if value_file == "-" else Path(value_file).read_text()
    value = raw.splitlines()[0] if raw.strip() else ""
    info = Secret.create(name, hosts=host, value=value, header=header, format=format,
                         basic=basic, query=query, env=env, inject=inject, replace=replace,
                         provider=provider())
    if want_json(json_out):
        print_json(info.model_dump())
        return
    console.print(f"Stored: {info.describe()}; in a sandbox made with --secrets {info.name}, "
                  f"{info.env}=abx-secret:{info.name}")


@app.command("list", epilog="Example: abx secrets list --json")
def list_(json_out: JsonOpt = False) -> None:
    """Your secrets and their rules (values are never shown)."""
    from agent_sandbox import Secret

    secrets = Secret.list(provider=provider())
    if want_json(json_out):
        print_json([s.model_dump() for s in secrets])
        return
    if not secrets:
        console.print("No secrets.")
        return
    table = Table("name", "hosts", "sent as", "env", "created")
    for s in secrets:
        how = f"?{s.query}=" if s.query else f"{s.header}: {s.format}" + (
            " (basic)" if s.basic else "")
        table.add_row(s.name, ", ".join(s.hosts), how, s.env,
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created_at)))
    console.print(table)


@app.command("rm", epilog="Example: abx secrets rm gh")
def rm(names: Annotated[list[str], typer.Argument(help="Secret names.")]) -> None:
    """Delete secrets (sandboxes made with one keep it until they end)."""
    from agent_sandbox import Secret

    p = provider()
    for name in names:
        Secret.delete(name, provider=p)
        console.print(f"Deleted secret {name}.")
