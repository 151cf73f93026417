"""The ``abx`` command line (typer): every command. ``agent_sandbox.surfaces.cli.main`` runs it."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any

import typer
import typer.main

from agent_sandbox.surfaces.cli import config_cmd, mcp_cmd
from agent_sandbox.surfaces.cli.output import EXIT_FAILURE, EXIT_USAGE, CliError, set_global_json
from agent_sandbox.surfaces.cli.settings import cli_settings


class _App(typer.Typer):
    """Turns errors the engine/SDK raise into one line and a meaningful exit code."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from agent_sandbox.core.errors import (
            InvalidArgumentError,
            SandboxError,
            UnauthenticatedError,
        )

        command = typer.main.get_command(self)  # what Typer.__call__ runs, tidied first
        _for_people(command)
        try:
            return command(*args, **kwargs)
        except CliError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except InvalidArgumentError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        except UnauthenticatedError as exc:  # a gateway's 401
            from agent_sandbox.surfaces.cli.sdkutil import unauthenticated

            print(f"error: {unauthenticated(exc.message)}", file=sys.stderr)
            sys.exit(EXIT_FAILURE)
        except SandboxError as exc:
            print(f"error: {exc.message} ({exc.code})", file=sys.stderr)
            sys.exit(EXIT_FAILURE)
        except OSError as exc:  # a file we could not write: say which, and what fits
            from agent_sandbox.surfaces.cli.fs_errors import describe, under_home

            hint = "" if under_home(exc.filename or "") else _ENGINE_HINT
            print(f"error: {describe(exc, instead=hint, action='')}", file=sys.stderr)
            sys.exit(EXIT_FAILURE)


def _for_people(command: Any, parent: Any = None, name: str = "abx") -> None:
    """Help as people read it, for ``command`` and every command under it: a docstring's
    paragraphs each one line (typer's rich help keeps their line breaks, so a command list
    broke mid-sentence), and a flag shown without a type (``--json <bool>`` reads as if it
    took a value). The help option is made here, as click makes it, to be tidied too."""
    ctx = command.context_class(command, info_name=name, parent=parent,
                                **command.context_settings)
    if command.help:
        command.help = _reflow(command.help)
    for param in [*command.params, command.get_help_option(ctx)]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub, child in getattr(command, "commands", {}).items():
        _for_people(child, ctx, sub)


def _reflow(text: str) -> str:
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


# Not "run with sudo": an ordinary user has the rootless engine or the daemon.
_ENGINE_HINT = "`abx doctor` shows which engine this user can use and what to fix"


app = _App(
    name="abx",
    help="agent-sandbox: secure sandboxes for AI agents, reached over MCP.\n\n"
         "Start with `abx doctor`, then `abx mcp install --target cursor`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from agent_sandbox import __version__

        print(f"abx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(ctx: typer.Context,
          json_out: Annotated[bool, typer.Option("--json", help="JSON output for every "
                                                 "command that has it.")] = False,
          version: Annotated[bool, typer.Option(
              "--version", is_eager=True, callback=_print_version,
              help="Print the version (abx-sandbox distribution) and exit.")] = False) -> None:
    set_global_json(json_out)
    if ctx.invoked_subcommand != "config":  # `abx config` must be able to fix a bad value
        cli_settings()  # read the environment (and ./.env, ~/.abx/config) once, here


app.add_typer(mcp_cmd.app, name="mcp")
app.add_typer(config_cmd.app, name="config")


def _register_rest() -> None:
    from agent_sandbox.surfaces.cli import (
        doctor,
        sandbox_cmd,
        secrets_cmd,
        snapshot_cmd,
        template_cmd,
        volume_cmd,
    )

    app.add_typer(sandbox_cmd.app, name="sandbox")
    app.add_typer(template_cmd.app, name="template")
    app.add_typer(volume_cmd.app, name="volume")
    app.add_typer(secrets_cmd.app, name="secrets")
    app.add_typer(snapshot_cmd.app, name="snapshot")
    app.command(epilog="Example: abx doctor --json")(doctor.doctor)


def _register_gateway() -> None:
    from agent_sandbox.surfaces.cli import daemon_cmd, keys_cmd, serve_cmd

    app.command(epilog="Examples:\n\n  abx serve --port 8080\n\n"
                       "  abx serve --host 0.0.0.0 --api-keys-file /etc/abx/keys.db\n\n"
                       "  sudo abx serve --unix /run/abx/abx.sock")(serve_cmd.serve)
    app.add_typer(keys_cmd.app, name="keys")
    app.add_typer(daemon_cmd.app, name="daemon")


_register_rest()
_register_gateway()
