"""Samples of each sandbox's resource use, read from its backend when asked for and kept
(bounded: ``MAX_SAMPLES`` a sandbox; a sandbox killed is forgotten at once, one that ended
by itself at the next prune), so a caller sees its use over time and the CPU share between
two samples."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from agent_sandbox.core.metrics import MAX_SAMPLES, SandboxMetrics, Usage

MIN_INTERVAL = 1.0  # seconds: a sample asked for sooner is the last one again
PRUNE_INTERVAL = 60.0  # seconds between two looks for sandboxes gone (a listing each)


class MetricsHistory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[str, deque[SandboxMetrics]] = {}
        self._cpu: dict[str, tuple[float, float]] = {}  # id: (time, cpu seconds) last read
        self._pruned = time.monotonic()

    def sample(self, sandbox_id: str, started: float, read: Callable[[], Usage]) -> None:
        """Read a sample now (``read`` is the backend's reading, made outside the lock)."""
        with self._lock:
            last = self._samples.get(sandbox_id)
            if last and time.time() - last[-1].timestamp < MIN_INTERVAL:
                return
        usage = read()
        at = time.time()
        with self._lock:
            before = self._cpu.get(sandbox_id, (started, 0.0))
            self._cpu[sandbox_id] = (at, usage.cpu_seconds)
            samples = self._samples.setdefault(sandbox_id, deque(maxlen=MAX_SAMPLES))
            samples.append(SandboxMetrics.of(usage, at, before))

    def samples(self, sandbox_id: str, start: float | None,
                end: float | None) -> list[SandboxMetrics]:
        with self._lock:
            found = list(self._samples.get(sandbox_id, ()))
        return [s for s in found if (start is None or s.timestamp >= start)
                and (end is None or s.timestamp <= end)]

    def latest(self, sandbox_id: str) -> SandboxMetrics | None:
        with self._lock:
            found = self._samples.get(sandbox_id)
            return found[-1] if found else None

    def prune_due(self) -> bool:
        """Whether it is time to forget the sandboxes gone (``keep_only``)."""
        with self._lock:
            if time.monotonic() - self._pruned < PRUNE_INTERVAL:
                return False
            self._pruned = time.monotonic()
            return True

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._samples.pop(sandbox_id, None)
            self._cpu.pop(sandbox_id, None)

    def keep_only(self, live: Iterable[str]) -> None:
        """Forget the sandboxes not in ``live`` (gone by a kill or by themselves)."""
        keep = set(live)
        with self._lock:
            for gone in [k for k in self._samples if k not in keep]:
                del self._samples[gone]
                self._cpu.pop(gone, None)
