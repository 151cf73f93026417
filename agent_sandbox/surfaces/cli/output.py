"""Printing for the CLI: Rich for people, JSON for scripts, errors on stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from rich.console import Console

PIPED_WIDTH = 10_000


def _width(stream: TextIO) -> int | None:
    """Rich's own width (the terminal's, or $COLUMNS) on a terminal or when COLUMNS is
    set; piped, so wide that no table is cut at 80 columns (`key-46a…`): a table takes
    only the width its cells need. Scripts that want fields have --json."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        tty = False
    return None if tty or os.environ.get("COLUMNS", "").strip().isdigit() else PIPED_WIDTH


console = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A failure the user can act on: printed as ``error: <message>``, then exit ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = code


class UsageError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


_global = {"json": False}


def set_global_json(value: bool) -> None:
    _global["json"] = value


def want_json(local: bool) -> bool:
    """``--json`` given on the command, or globally (``abx --json ...``)."""
    return local or _global["json"]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    """Human chatter: to stderr, so stdout stays parseable."""
    err_console.print(message)


def mask(secret: str | None) -> str:
    if not secret:
        return ""
    return f"{secret[:4]}****" if len(secret) >= 16 else "****"
