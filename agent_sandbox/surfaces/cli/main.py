"""The ``abx`` executable (console script ``agent_sandbox.surfaces.cli.main:main``).

``abx mcp start`` with no options, what every installed MCP client config runs, execs the
STDIO server straight away (``stdio_launch``: standard library only); everything else is
the typer CLI in ``agent_sandbox.surfaces.cli.app``.
"""

from __future__ import annotations

import sys
from typing import Any


def main(*args: Any, **kwargs: Any) -> Any:
    from agent_sandbox.surfaces.cli.stdio_launch import exec_server

    exec_server(sys.argv[1:])  # returns only when the full CLI must handle the command
    from agent_sandbox.surfaces.cli.app import app_for

    return app_for(kwargs.get("args") or sys.argv[1:])(*args, **kwargs)


# Console scripts installed from earlier checkouts (editable installs) call ``...main:app``.
app = main

# `python -m agent_sandbox.surfaces.cli.main` (tests/k8scluster.py runs it)
if __name__ == "__main__":
    main(prog_name="abx")
