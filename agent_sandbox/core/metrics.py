"""A sandbox's resource use: what a backend reads of it (``Usage``: counters, from its
cgroup and its disk) and what callers see (``SandboxMetrics``: one sample in time, with the
CPU share since the sample before). E2B's ``SandboxMetric`` is this shape."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

# Samples kept per sandbox (one a second at most): the last ~2 hours at one every minute.
MAX_SAMPLES = 120


@dataclass(frozen=True)
class Usage:
    """A backend's reading of a sandbox now: cumulative CPU time, memory and disk."""

    cpu_seconds: float  # CPU time used since it started (all its processes)
    cpu_count: int  # CPUs it may use
    mem_used: int  # bytes charged to it, page cache included
    mem_cache: int  # of which page cache
    mem_total: int  # its memory limit (the host's memory when it has none)
    disk_used: int  # bytes used on its disk
    disk_total: int  # its disk's size


class SandboxMetrics(BaseModel):
    timestamp: float = Field(description="when it was read (Unix seconds)")
    cpu_count: int = Field(description="CPUs the sandbox may use")
    cpu_used_pct: float = Field(description="CPU used since the sample before (or since "
                                "it started), in percent of its CPUs")
    mem_used: int = Field(description="memory used, in bytes (page cache included)")
    mem_cache: int = Field(description="of which page cache, in bytes")
    mem_total: int = Field(description="its memory limit, in bytes")
    disk_used: int = Field(description="disk used, in bytes")
    disk_total: int = Field(description="its disk's size, in bytes")

    @classmethod
    def of(cls, usage: Usage, at: float, before: tuple[float, float]) -> SandboxMetrics:
        """A sample of ``usage`` read at ``at``; ``before``: (time, cpu_seconds) of the
        sample before it (or of its start, with no CPU used)."""
        wall = max(at - before[0], 1e-3)
        share = (usage.cpu_seconds - before[1]) / (wall * max(usage.cpu_count, 1))
        return cls(timestamp=at, cpu_count=usage.cpu_count,
                   cpu_used_pct=round(min(max(share, 0.0), 1.0) * 100, 2),
                   mem_used=usage.mem_used, mem_cache=usage.mem_cache,
                   mem_total=usage.mem_total, disk_used=usage.disk_used,
                   disk_total=usage.disk_total)
