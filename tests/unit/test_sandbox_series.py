"""The gateway's per-sandbox Prometheus series stay bounded: only the sandboxes using the
most memory get series, and the others are counted."""

from __future__ import annotations

from agent_sandbox.core.metrics import SandboxMetrics, Usage
from agent_sandbox.surfaces.http.metrics import MAX_SANDBOX_SERIES, Metrics


def _sample(mem: int) -> SandboxMetrics:
    usage = Usage(cpu_seconds=1.0, cpu_count=2, mem_used=mem, mem_cache=0, mem_total=1 << 30,
                  disk_used=1, disk_total=2)
    return SandboxMetrics.of(usage, 10.0, (8.0, 0.0))


def test_series_are_bounded_to_the_biggest_sandboxes() -> None:
    usage = {f"sbx-{i:04d}": _sample(i + 1) for i in range(MAX_SANDBOX_SERIES + 30)}
    text = Metrics().render(["running"] * len(usage), None, usage)
    lines = [line for line in text.splitlines() if line.startswith("abx_sandbox_memory_used")]
    assert len(lines) == MAX_SANDBOX_SERIES
    assert 'abx_sandbox_memory_used_bytes{sandbox="sbx-0129"} 130' in lines
    assert not any('"sbx-0000"' in line for line in lines)  # the smallest is left out
    assert "abx_sandbox_series_omitted 30" in text.splitlines()


def test_cpu_share_is_of_the_sandboxs_cpus_since_the_sample_before() -> None:
    # 1 CPU-second over 2 s on 2 CPUs: a quarter of what it may use.
    assert _sample(1).cpu_used_pct == 25.0
