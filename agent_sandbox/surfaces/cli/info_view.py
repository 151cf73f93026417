"""``abx sandbox info`` for people: local times with their age, limits with units,
maps as ``name=value`` lines (``--json`` keeps the raw fields)."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

_LIMIT_UNITS = {"memory_mb": ("memory", "MiB"), "disk_mb": ("disk", "MiB"),
                "cpu": ("cpu", "cores"), "pids": ("processes", "")}


def ago(ts: float, now: float | None = None) -> str:
    seconds = max(0, int((time.time() if now is None else now) - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def when(ts: float, now: float | None = None) -> str:
    """``2026-12-04 09:41:02 (3m ago)`` in local time; ``-`` when unknown."""
    if not ts:
        return "-"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({ago(ts, now)})"


def seconds(value: float) -> str:
    value = float(value)
    if value >= 3600 and value % 3600 == 0:
        return f"{value / 3600:g} h"
    if value >= 60 and value % 60 == 0:
        return f"{value / 60:g} min"
    return f"{value:g} s"


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def limits(values: dict[str, Any], enforced: dict[str, bool]) -> str:
    parts = []
    for key, value in values.items():
        name, unit = _LIMIT_UNITS.get(key, (key, ""))
        if unit == "cores" and value == 1:
            unit = "core"
        shown = f"{name} {_number(value)}{' ' + unit if unit else ''}"
        short = key.removesuffix("_mb")
        if short in enforced and not enforced[short]:
            shown += " (not enforced here)"
        parts.append(shown)
    return "\n".join(parts) or "-"


def network(value: Any) -> str:
    """A sandbox's network policy (a gateway from before policies says true/false)."""
    from agent_sandbox.core.errors import SandboxError
    from agent_sandbox.core.network import parse

    try:
        policy = parse(value)
    except SandboxError:
        return str(value)
    if policy.mode == "off":
        return "off (loopback only)"
    return policy.describe() + ("" if policy.mode == "full" else " and nothing else")


def size(value: float) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift:
            return f"{value / (1 << shift):.1f} {unit}"
    return f"{int(value)} B"


def usage(m: dict[str, Any] | None) -> str:
    """A sample of ``Sandbox.get_metrics()``: CPU, memory and disk on one line each."""
    if not m:
        return "-"
    cores = "core" if m["cpu_count"] == 1 else "cores"
    return (f"cpu {m['cpu_used_pct']:g}% of {m['cpu_count']} {cores}\n"
            f"memory {size(m['mem_used'])} of {size(m['mem_total'])}\n"
            f"disk {size(m['disk_used'])} of {size(m['disk_total'])}")


def pairs(values: dict[str, Any]) -> str:
    return "\n".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"


def info_table(data: dict[str, Any], now: float | None = None) -> Table:
    """The rows of ``sandbox info``: what a person asks first, first."""
    state = str(data.get("state", ""))
    rows: list[tuple[str, str]] = [
        ("id", str(data.get("sandbox_id", ""))),
        ("state", state),
        ("template", str(data.get("template", ""))),
        ("created", when(data.get("created_at") or 0, now)),
        ("last used", when(data.get("last_used") or 0, now)),
    ]
    timeout = data.get("timeout")
    if timeout is not None:
        text = f"{seconds(timeout)} idle"
        last = data.get("last_used") or 0
        if state == "running" and last:
            text += " (auto-pause " + time.strftime(
                "%H:%M:%S", time.localtime(last + float(timeout))) + ")"
        rows.append(("timeout", text))
    rows += [
        ("persistent", "yes" if data.get("persistent") else "no"),
        ("network", network(data.get("network"))),
        ("volume", str(data.get("volume_id") or "-")),
        ("limits", limits(data.get("limits") or {}, data.get("enforced") or {})),
        ("usage", usage(data.get("usage"))),
        ("metadata", pairs(data.get("metadata") or {})),
        ("env", ", ".join(data.get("env_names") or []) or "-"),
    ]
    if data.get("owner"):
        rows.append(("owner", str(data["owner"])))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table
