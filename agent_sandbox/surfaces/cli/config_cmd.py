"""``abx config``: settings in ~/.abx/config (0600); env, then ./.env, then the file."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from agent_sandbox.config.settings import (
    Settings,
    SettingsError,
    check_value,
    env_name,
    extra_of,
    shown_default,
)
from agent_sandbox.surfaces.cli.output import (
    CliError,
    console,
    err_console,
    mask,
    print_json,
    want_json,
)
from agent_sandbox.surfaces.cli.settings import (
    KEYS,
    cli_settings,
    config_path,
    key_of,
    read_config,
    resolve,
    write_config,
)

app = typer.Typer(help="Settings and credentials, kept in ~/.abx/config (mode 0600).",
                  no_args_is_help=True)

KEY_HELP = f"One of: {', '.join(KEYS)}"
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.command("set", epilog="Example: abx config set sandbox_api_key sk-...")
def set_(key: Annotated[str, typer.Argument(help=KEY_HELP)],
         value: Annotated[str, typer.Argument(help="The value.")]) -> None:
    """Save a setting in ~/.abx/config. The environment and ./.env still win over it."""
    k = key_of(key)
    if not value.strip():
        raise CliError(f"empty value; to remove {key} use `abx config unset {key}`", 2)
    try:
        check_value(k.field, value.strip())
    except SettingsError as exc:
        raise CliError(f"{exc.message}; nothing was saved", 2) from None
    data = read_config()
    data[key] = value.strip()
    path = write_config(data, instead=f"set {k.env} in the environment instead")
    shown = mask(value) if k.secret else value
    console.print(f"{key} = {shown}  (saved in {path})")


@app.command(epilog="Example: abx config get base_url --json")
def get(key: Annotated[str, typer.Argument(help=KEY_HELP)], json_out: JsonOpt = False,
        reveal: Annotated[bool, typer.Option(
            "--reveal", help="Print a secret (an API key) in clear; masked otherwise.")] = False,
        ) -> None:
    """Print the value a setting resolves to (environment, then ./.env, then ~/.abx/config).

    Secrets are masked unless --reveal (a terminal, a CI log or a screen share is not the
    place for a key). Exit code 1 when it is not set anywhere.
    """
    r = resolve(key)
    value = mask(r.value) if (r.key.secret and r.value and not reveal) else r.value
    if want_json(json_out):
        print_json({"key": key, "env": r.key.env, "value": value, "source": r.source,
                    "masked": value != r.value})
    elif value is not None:
        console.print(value, markup=False, highlight=False)
    if r.value is None:
        if not want_json(json_out):
            err_console.print(f"{key} is not set (set it with `abx config set {key} VALUE` or "
                              f"the {r.key.env} environment variable)")
        raise typer.Exit(1)


@app.command("list", epilog="Example: abx config list")
def list_(json_out: JsonOpt = False) -> None:
    """Show every setting, where it comes from, with secrets masked."""
    rows = []
    for name, k in KEYS.items():
        r = resolve(name)
        value = mask(r.value) if (k.secret and r.value) else r.value
        rows.append({"key": name, "env": k.env, "value": value, "source": r.source,
                     "secret": k.secret})
    if want_json(json_out):
        print_json({"config": str(config_path()), "settings": rows})
        return
    table = Table("key", "value", "source", "env variable")
    for row in rows:
        table.add_row(row["key"], row["value"] or "-", row["source"] or "-", row["env"])
    console.print(table)
    console.print(f"file: {config_path()}  (order: environment > ./.env > file)", style="dim")


@app.command("vars", epilog="Example: abx config vars --json")
def vars_(json_out: JsonOpt = False) -> None:
    """Every environment variable abx reads: its value in this run (secrets masked; from the
    environment, or ./.env and ~/.abx/config for the keys above), default and meaning."""
    settings = cli_settings()
    rows = []
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        shown = ",".join(value) if isinstance(value, tuple) else \
            None if value is None else str(value)
        if extra_of(name).get("secret") and shown:
            shown = mask(shown)
        rows.append({"env": env_name(name), "value": shown,
                     "set": name in settings.model_fields_set,
                     "default": shown_default(name), "meaning": field.description})
    if want_json(json_out):
        print_json({"variables": rows})
        return
    table = Table("variable", "value", "default", "meaning")
    for row in rows:
        table.add_row(row["env"], (row["value"] or "-") if row["set"] else "-",
                      row["default"], row["meaning"])
    console.print(table)
    console.print("- : not set (the default applies); docs/configuration.md lists the same",
                  style="dim")


@app.command(epilog="Example: abx config unset region")
def unset(key: Annotated[str, typer.Argument(help=KEY_HELP)]) -> None:
    """Remove a setting from ~/.abx/config (the environment and ./.env are not touched)."""
    key_of(key)
    data = read_config()
    if key not in data:
        console.print(f"{key} was not set in {config_path()} (nothing to do)")
        return
    del data[key]
    write_config(data)
    console.print(f"{key} removed from {config_path()}")
