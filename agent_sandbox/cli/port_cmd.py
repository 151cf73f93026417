"""``abx sandbox port SANDBOX PORT``: reach a server listening inside a sandbox."""

from __future__ import annotations

import threading
from typing import Any

from agent_sandbox.cli.output import console, print_json, want_json


def port(sandbox: Any, sandbox_id: str, number: int, json_out: bool) -> None:
    url = sandbox.expose_port(number)
    local = url.startswith("http://127.0.0.1:")
    if want_json(json_out):
        print_json({"sandbox_id": sandbox_id, "port": number, "url": url,
                    "forwarding_here": local})
    else:
        console.print(f"{sandbox_id} port {number}: {url}", markup=False, highlight=False)
    if not local:
        return  # the gateway forwards it, behind its API key; nothing to keep open here
    if not want_json(json_out):
        console.print("Forwarding through this process (any TCP: HTTP, WebSockets...); "
                      "Ctrl-C stops.", style="dim")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        return
