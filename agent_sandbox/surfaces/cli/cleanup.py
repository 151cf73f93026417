"""``abx doctor --cleanup``: leave nothing of the embedded engine mounted on the host.

Recovery runs first (half-made or half-killed sandboxes are finished, orphan containers
and mounts removed), the warm pool is drained, then the read-only template views are
unmounted and the data dir's lifecycle supervisor stopped. With no sandbox left, nothing
of agent-sandbox is mounted or running any more and the data dir can be deleted (the
uninstall path); with sandboxes left, it says which.
"""

from __future__ import annotations

import typer

from agent_sandbox.core.errors import WrongStateError
from agent_sandbox.surfaces.cli.output import console, print_json, want_json


def cleanup(json_out: bool) -> None:
    from agent_sandbox.providers.local import local_provider

    engine = local_provider()  # its start is the recovery
    data_dir = engine.config.data_dir
    drained = engine.drain_pool()
    live = [s.sandbox_id for s in engine.list()]
    released = False
    if not live:
        try:
            engine.backend.release_host()
            released = True
        except WrongStateError:  # one appeared meanwhile, from another process
            live = [s.sandbox_id for s in engine.list()]
    left = engine.backend.leftovers()
    ok = released and not left
    if want_json(json_out):
        print_json({"ok": ok, "data_dir": str(data_dir), "pool_drained": drained,
                    "sandboxes": live, "mounts_left": left})
    elif ok:
        console.print(f"Nothing of agent-sandbox is mounted under {data_dir} any more "
                      f"({drained} warm sandboxes drained).\nTo uninstall: rm -rf {data_dir}")
    elif live:
        console.print(f"{len(live)} sandbox(es) still exist ({', '.join(live[:5])}"
                      f"{', ...' if len(live) > 5 else ''}): kill them (abx sandbox kill ID), "
                      "then run `abx doctor --cleanup` again.")
    else:
        console.print(f"Still mounted under {data_dir}: {', '.join(left)}; another engine "
                      "process may be using them: stop it, then run this again.")
    if not ok:
        raise typer.Exit(1)
