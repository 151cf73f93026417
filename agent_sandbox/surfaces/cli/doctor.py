"""``abx doctor``: can this host run sandboxes? Each failure comes with the fix."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from agent_sandbox.core.health import Check
from agent_sandbox.surfaces.cli.output import console, print_json, want_json
from agent_sandbox.surfaces.cli.settings import cli_settings


def check_engine() -> Check:
    """Which engine this process would use (``ABX_ENGINE``, the daemon, root or rootless)."""
    from agent_sandbox.providers.choice import choose_engine

    choice = choose_engine(cli_settings())
    if choice.kind is None:
        return Check("engine", False, choice.error or choice.reason,
                     "see docs/daemon.md (which engine a process uses)")
    where = f" at {choice.target}" if choice.target else ""
    return Check("engine", True, f"{choice.kind}{where} ({choice.reason})")


def check_templates() -> Check:
    """The templates of the engine this user really gets (a daemon's or gateway's too)."""
    from agent_sandbox.providers.select import current_engine, default_provider

    settings = cli_settings()
    local = current_engine(settings).kind in ("embedded", "rootless")
    if local and not settings.data_dir.exists():
        return Check("templates", True, "none yet (the built-in 'base' appears on first use)",
                     required=False)
    try:
        names = [t.name for t in default_provider(settings).list_templates()]
    except Exception as exc:  # noqa: BLE001 - report, do not crash
        return Check("templates", False, f"cannot open the engine: {exc}",
                     "fix the failures above, then run `abx doctor` again")
    return Check("templates", bool(names), ", ".join(names) or "none",
                 "" if names else "abx template build NAME DIR")


def run_checks() -> list[Check]:
    from agent_sandbox.providers.choice import choose_engine
    from agent_sandbox.providers.doctor import host_checks

    settings = cli_settings()
    kind = choose_engine(settings).kind
    checks = [check_engine(), *host_checks(settings, local=kind in ("embedded", "rootless"),
                                           served=kind in ("daemon", "remote"))]
    if all(c.ok for c in checks if c.required):
        checks.append(check_templates())
    return checks


def checks_table(checks: list[Check]) -> Table:
    """Every word of a detail or a fix is shown: long commands and paths fold onto the
    next line instead of being cut off with an ellipsis."""
    table = Table("check", "", "detail", "fix")
    table.columns[0].no_wrap = True
    table.columns[1].no_wrap = True
    for column in table.columns[2:]:
        column.overflow = "fold"
        column.ratio = 1
    for c in checks:
        mark = "[green]ok[/green]" if c.ok else ("[red]FAIL[/red]" if c.required
                                                 else "[yellow]warn[/yellow]")
        table.add_row(c.name, mark, Text(c.detail), Text(c.fix))  # not Rich markup
    return table


def doctor(json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
           = False,
           cleanup: Annotated[bool, typer.Option(
               "--cleanup", help="Instead: unmount what the embedded engine left on the host "
                                 "(finish crashed work, drain the pool, release template "
                                 "views); with no sandbox left the data dir can be deleted.")]
           = False) -> None:
    """Check this host can run sandboxes, and print the fix for each failure.

    Engine (root, daemon, rootless), runc, namespaces, overlayfs, cgroups, real limits, seccomp.

    A network proxy is started as the engine starts it and asked for the registries' names.

    Exits 1 when a required check fails."""
    if cleanup:
        from agent_sandbox.surfaces.cli.cleanup import cleanup as run_cleanup

        run_cleanup(json_out)
        return
    checks = run_checks()
    failed = [c for c in checks if not c.ok and c.required]
    if want_json(json_out):
        print_json({"ok": not failed, "checks": [asdict(c) for c in checks]})
    else:
        console.print(checks_table(checks))
        warned = sum(1 for c in checks if not c.ok and not c.required)
        if not failed:
            console.print("All required checks passed" + (f"; {warned} warning(s) above."
                                                          if warned else "."))
        else:  # whole lines too, to copy and paste (the table folds long ones)
            console.print(f"{len(failed)} required check(s) failed; the fixes:")
            for c in failed:
                console.print(Text(f"  {c.name}: {c.fix}"))
    if failed:
        raise typer.Exit(1)
