"""A process's memory from /proc, for the tests that bound a transfer's memory."""

from __future__ import annotations

from pathlib import Path


def status_kb(pid: int | str, field: str) -> int:
    """A KiB figure of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid: int | str) -> int:
    """Set the process's peak RSS (VmHWM) back to its current RSS, so the peak read later
    is this transfer's alone, not start-up's; returns that RSS in KiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_kb(pid, "VmRSS")
