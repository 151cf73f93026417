"""The ``abx`` command line (typer): every command. ``agent_sandbox.surfaces.cli.main`` runs it."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Annotated, Any

import typer
import typer.main

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


def _new_app() -> _App:
    app = _App(
        name="abx",
        help="agent-sandbox: secure sandboxes for AI agents, reached over MCP.\n\n"
             "Start with `abx doctor`, then `abx mcp install --target cursor`.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_root)
    return app


def _print_version(value: bool) -> None:
    if value:
        from agent_sandbox import __version__

        print(f"abx {__version__}")
        raise typer.Exit()


def _root(ctx: typer.Context,
          json_out: Annotated[bool, typer.Option("--json", help="JSON output for every "
                                                 "command that has it.")] = False,
          version: Annotated[bool, typer.Option(
              "--version", is_eager=True, callback=_print_version,
              help="Print the version (abx-sandbox distribution) and exit.")] = False) -> None:
    set_global_json(json_out)
    if ctx.invoked_subcommand != "config":  # `abx config` must be able to fix a bad value
        cli_settings()  # read the environment (and ./.env, ~/.abx/config) once, here


# Every command, in the order help lists them: its module, the typer app (a group) or
# function (a command) in it, and a command's epilog. A command line naming one imports
# only it: the others' imports and typer's reading of their signatures are ~200 ms.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "mcp": ("mcp_cmd", "app", ""),
    "config": ("config_cmd", "app", ""),
    "sandbox": ("sandbox_cmd", "app", ""),
    "template": ("template_cmd", "app", ""),
    "volume": ("volume_cmd", "app", ""),
    "secrets": ("secrets_cmd", "app", ""),
    "snapshot": ("snapshot_cmd", "app", ""),
    "doctor": ("doctor", "doctor", "Example: abx doctor --json"),
    "serve": ("serve_cmd", "serve",
              "Examples:\n\n  abx serve --port 8080\n\n"
              "  abx serve --host 0.0.0.0 --api-keys-file /etc/abx/keys.db\n\n"
              "  sudo abx serve --unix /run/abx/abx.sock"),
    "keys": ("keys_cmd", "app", ""),
    "daemon": ("daemon_cmd", "app", ""),
}


def app_for(argv: list[str]) -> _App:
    """The CLI with the command ``argv`` names, or with every command (help, a typo)."""
    named = next((a for a in argv if not a.startswith("-")), None)
    app = _new_app()
    for name in [named] if named in COMMANDS else list(COMMANDS):
        module_name, attribute, epilog = COMMANDS[name]
        found = getattr(importlib.import_module(f"agent_sandbox.surfaces.cli.{module_name}"),
                        attribute)
        if isinstance(found, typer.Typer):
            app.add_typer(found, name=name)
        else:
            app.command(name=name, epilog=epilog)(found)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":  # every command: what tests and tools that walk the CLI read
        return app_for([])
    raise AttributeError(name)
