"""The ``abx`` executable (console script ``agent_sandbox.cli.main:main``).

``abx mcp start`` with no options, what every installed MCP client config runs, execs the
STDIO server straight away (``stdio_launch``: standard library only); everything else is
the typer CLI in ``agent_sandbox.cli.app``.
"""

from __future__ import annotations

import sys
from typing import Any


def main(*args: Any, **kwargs: Any) -> Any:
    from agent_sandbox.cli.stdio_launch import exec_server

    exec_server(sys.argv[1:])  # returns only when the full CLI must handle the command
    from agent_sandbox.cli.app import app as cli

    return cli(*args, **kwargs)


# Console scripts installed from earlier checkouts (editable installs) call ``...main:app``.
app = main

if __name__ == "__main__":  # `python -m agent_sandbox.cli.main` (tests/k8scluster.py runs it)
    main(prog_name="abx")
