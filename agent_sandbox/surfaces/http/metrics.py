"""Prometheus text metrics: requests, latencies, sandboxes by state, code runs, and each
running sandbox's CPU, memory and disk (at most ``MAX_SANDBOX_SERIES`` sandboxes: those
using the most memory).

Kept by hand (a few dicts under a lock) rather than with prometheus_client: four metric
families do not justify a dependency, and the text format is simple.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_sandbox.core.metrics import SandboxMetrics

# Label values come from a fixed set: a client chooses the method it sends, and a label
# per invented method would grow /metrics without bound.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MAX_SANDBOX_SERIES = 100  # sandboxes with series of their own (a scrape's size stays bounded)
_PER_SANDBOX = (  # (name, help, field of SandboxMetrics)
    ("abx_sandbox_cpu_used_percent", "CPU used since the sample before, in percent of its "
     "CPUs.", "cpu_used_pct"),
    ("abx_sandbox_memory_used_bytes", "Memory used (page cache included).", "mem_used"),
    ("abx_sandbox_memory_limit_bytes", "Its memory limit.", "mem_total"),
    ("abx_sandbox_disk_used_bytes", "Disk used.", "disk_used"),
    ("abx_sandbox_disk_size_bytes", "Its disk's size.", "disk_total"),
)
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self._hist: dict[tuple[str, str], list[int]] = {}
        self._sum: Counter[tuple[str, str]] = Counter()
        self.code_runs: Counter[str] = Counter()

    def code_run(self, outcome: str) -> None:
        """A run_code cell ended: ok, error (the code raised), timeout, or failed (no
        execution: bad argument, no kernel...)."""
        with self._lock:
            self.code_runs[outcome] += 1

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "other"
        status = status if 100 <= status <= 599 else 0
        with self._lock:
            self.requests[(method, route, status)] += 1
            counts = self._hist.setdefault((method, route), [0] * (len(BUCKETS) + 1))
            counts[bisect.bisect_left(BUCKETS, seconds)] += 1
            self._sum[(method, route)] += seconds

    def render(self, sandbox_states: Iterable[str], disk: dict[str, int] | None,
               usage: dict[str, SandboxMetrics] | None = None) -> str:
        lines = ["# HELP abx_sandboxes Live sandboxes by state.", "# TYPE abx_sandboxes gauge"]
        states = Counter(sandbox_states)
        for state in sorted({"running", "paused", *states}):
            lines.append(f'abx_sandboxes{{state="{state}"}} {states[state]}')
        if usage is not None:
            lines += _per_sandbox(usage)
        if disk is not None:  # None: sandboxes do not live on this host
            lines += ["# HELP abx_host_disk_free_bytes Free space on the engine's data dir.",
                      "# TYPE abx_host_disk_free_bytes gauge",
                      f"abx_host_disk_free_bytes {disk['free_bytes']}",
                      "# HELP abx_host_disk_reserve_bytes Free space creates never go below.",
                      "# TYPE abx_host_disk_reserve_bytes gauge",
                      f"abx_host_disk_reserve_bytes {disk['reserve_bytes']}"]
        with self._lock:
            lines += ["# HELP abx_code_runs_total run_code cells by outcome.",
                      "# TYPE abx_code_runs_total counter"]
            for outcome in sorted({"ok", "error", "timeout", "failed", *self.code_runs}):
                lines.append(f'abx_code_runs_total{{outcome="{outcome}"}} '
                             f"{self.code_runs[outcome]}")
            lines += ["# HELP abx_http_requests_total HTTP requests by route and status.",
                      "# TYPE abx_http_requests_total counter"]
            for (method, route, status), n in sorted(self.requests.items()):
                lines.append(f'abx_http_requests_total{{method="{method}",route="{route}",'
                             f'status="{status}"}} {n}')
            lines += ["# HELP abx_http_request_duration_seconds Request latency.",
                      "# TYPE abx_http_request_duration_seconds histogram"]
            for (method, route), counts in sorted(self._hist.items()):
                labels = f'method="{method}",route="{route}"'
                total = 0
                for bound, n in zip((*BUCKETS, float("inf")), counts, strict=True):
                    total += n
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    lines.append(f'abx_http_request_duration_seconds_bucket{{{labels},'
                                 f'le="{le}"}} {total}')
                lines.append(f"abx_http_request_duration_seconds_sum{{{labels}}} "
                             f"{self._sum[(method, route)]:.6f}")
                lines.append(f"abx_http_request_duration_seconds_count{{{labels}}} {total}")
        return "\n".join(lines) + "\n"


def _per_sandbox(usage: dict[str, SandboxMetrics]) -> list[str]:
    """The series of the ``MAX_SANDBOX_SERIES`` sandboxes using the most memory (ids are
    the service's own, ``sbx-`` and lowercase letters and digits: safe as label values)."""
    shown = sorted(usage.items(), key=lambda kv: (-kv[1].mem_used, kv[0]))
    lines = ["# HELP abx_sandbox_series_omitted Running sandboxes left out of the per-sandbox "
             f"series (only the {MAX_SANDBOX_SERIES} using the most memory are shown).",
             "# TYPE abx_sandbox_series_omitted gauge",
             f"abx_sandbox_series_omitted {max(0, len(shown) - MAX_SANDBOX_SERIES)}"]
    for name, text, field in _PER_SANDBOX:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{sandbox="{sandbox_id}"}} {getattr(m, field)}'
                  for sandbox_id, m in shown[:MAX_SANDBOX_SERIES]]
    return lines


class MetricsMiddleware:
    """Times each request to its last body byte (streams included), by route template,
    so /v1/sandboxes/{sandbox_id} is one series, not one per sandbox."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", None) or "unmatched"
            self.metrics.observe(scope["method"], name, status,
                                 time.perf_counter() - started)
