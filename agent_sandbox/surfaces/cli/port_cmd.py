"""``abx sandbox port SANDBOX PORT``: reach a server listening inside a sandbox."""

from __future__ import annotations

import signal
import threading
from typing import Any

from agent_sandbox.surfaces.cli.output import console, print_json, want_json


def port(sandbox: Any, sandbox_id: str, number: int, json_out: bool) -> None:
    url = sandbox.expose_port(number)
    local = url.startswith("http://127.0.0.1:")
    if want_json(json_out):
        print_json({"sandbox_id": sandbox_id, "port": number, "url": url,
                    "forwarding_here": local})
    else:
        console.print(f"{sandbox_id} port {number}: {url}", markup=False, highlight=False)
    if not local:  # HTTP(S) at the URL above; plain TCP through a local tunnel
        from agent_sandbox.surfaces.cli.port_tunnel import tunnel

        listener = tunnel(sandbox._provider, sandbox_id, number)
        where = f"127.0.0.1:{listener.getsockname()[1]}"
        if want_json(json_out):
            print_json({"sandbox_id": sandbox_id, "port": number, "tcp": where})
        else:
            console.print(f"plain TCP: {where} (tunnelled through the gateway)",
                          markup=False, highlight=False)
    if not want_json(json_out):
        console.print("Forwarding through this process (any TCP: HTTP, WebSockets...); "
                      "Ctrl-C stops.", style="dim")
    _wait_for_a_stop_signal()


def _wait_for_a_stop_signal() -> None:
    """Until Ctrl-C, SIGTERM or SIGHUP; handlers set here, not inherited: a process
    started with SIGINT ignored (a background job of a script, a CI runner) must still
    stop on it, and SIGTERM from a service manager must still run the exit cleanup."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):  # a timed wait: the handler runs between waits
        pass
