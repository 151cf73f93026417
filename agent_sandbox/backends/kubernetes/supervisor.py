"""The provider's background duties, one thread:

- write each sandbox's last use back to its record (at most every 30 s per sandbox), so
  idle timeouts survive a provider restart;
- pause or end sandboxes as the service decides (``lifecycle``: idle timeouts, lifetimes,
  the operator's maximum age);
- replace the Pods of running sandboxes that lost theirs (a node that stopped answering,
  an evicted or failed Pod): a new Pod on the same volume, memory lost;
- delete Pods whose sandbox record is gone (the cluster's garbage collector does too,
  through their owner reference; this covers a cluster without it);
- keep the warm pool full.
Every pass tolerates an unreachable API: it logs and tries again on the next.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.kubernetes import objects
from agent_sandbox.backends.kubernetes.cluster import timestamp
from agent_sandbox.backends.kubernetes.pods import START_TIMEOUT
from agent_sandbox.backends.kubernetes.pool import PodPool
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service import lifecycle

if TYPE_CHECKING:
    from agent_sandbox.backends.kubernetes.backend import KubernetesBackend
    from agent_sandbox.backends.kubernetes.pods import Live

log = logging.getLogger(__name__)
PASS_EVERY = 3.0  # seconds between passes, unless a sandbox's deadline comes sooner
PASS_GAP = 0.5  # seconds between passes at least (each reads the cluster), however woken
_ORPHAN_AFTER = 120.0  # seconds a Pod without its record is left alone


class Supervisor:
    def __init__(self, provider: KubernetesBackend, stop: threading.Event) -> None:
        self.provider = provider
        self.pool = PodPool(provider)
        self._stop = stop
        self._busy: set[str] = set()  # sandboxes a worker is on
        self._workers = ThreadPoolExecutor(8, thread_name_prefix="abx-k8s-replace")

    def start(self) -> None:
        threading.Thread(target=self._run, name="abx-k8s-supervisor", daemon=True).start()

    def _run(self) -> None:
        due: float | None = None  # the next sandbox's deadline: a pass then, not later
        hooks = self.provider.hooks
        while not hooks.wait_reap(due, PASS_EVERY, PASS_GAP) and not self._stop.is_set():
            try:
                due = self.pass_once()
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                log.warning("kubernetes supervisor pass failed: %s", exc)
                due = None

    def pass_once(self, now: float | None = None, wait: bool = False) -> float | None:
        """One pass; ``wait``: return once the pauses and replacements it started end.
        Returns when the reaper's next decision may be due (None: none by the clock)."""
        p = self.provider
        sandboxes = p.sandboxes
        for sandbox_id, used in sandboxes.unsaved_use().items():
            try:
                p._update(sandbox_id, last_used=used)
            except SandboxError:
                sandboxes.forget(sandbox_id)
        lives = sandboxes.load_all()
        lost_nodes = self._lost_nodes()
        now = now or time.time()
        known = {live.row.id for live in lives}
        started: list[Future[None]] = []
        for live in lives:
            # In use here (a create or resume in flight included): not idle, not lost.
            busy = p.hooks.activity.active(live.row.id)
            step = p.hooks.decide(live.row, now)
            if step is not None and step.ends:
                started.append(self._submit(live.row.id, f"ending: {step.value}",
                                            lambda sid, row=live.row, step=step:
                                            p.hooks.end(row, step)))
                continue
            if live.state != SandboxState.RUNNING or busy:
                continue
            if step is lifecycle.Step.PAUSE:
                started.append(self._submit(live.row.id, "idle: pausing",
                                            lambda sid: p.pause(sid)))
            elif live.node in lost_nodes or live.failed or (
                    live.pod is None and live.row.last_used < now - START_TIMEOUT):
                # (no Pod at all but recently used: another process may be starting it)
                started.append(self._submit(
                    live.row.id, f"lost its pod {live.pod}: starting a new one on its volume",
                    lambda sid, live=live: self._replace(live)))
        for pod in p.cluster.list("Pod", objects.LABEL_SANDBOX):
            labels = pod["metadata"].get("labels") or {}
            # Old enough that no create in flight (Secret first, Pod later) made it.
            old = timestamp(pod["metadata"].get("creationTimestamp")) < now - _ORPHAN_AFTER
            if labels.get(objects.LABEL_SANDBOX) not in known and old:
                p.cluster.delete("Pod", pod["metadata"]["name"])
        self.pool.refill()
        if wait:
            futures.wait([f for f in started if f is not None])
        dues = [p.hooks.next_change(live.row) for live in lives]
        return min((d for d in dues if d is not None), default=None)

    def _lost_nodes(self) -> set[str]:
        lost = set()
        for node in self.provider.cluster.nodes():
            ready = [c for c in (node.get("status") or {}).get("conditions") or []
                     if c.get("type") == "Ready"]
            if not ready or ready[0].get("status") != "True":
                lost.add(node["metadata"]["name"])
        return lost

    def _submit(self, sid: str, what: str, work: Any) -> Future[None] | None:
        """Run ``work(sid)`` on a worker, once at a time per sandbox: a step that waits on
        one sandbox (its lock, a slow Pod start) never holds up the pass."""
        if sid in self._busy:
            return None
        self._busy.add(sid)
        log.info("sandbox %s %s", sid, what)

        def run() -> None:
            try:
                work(sid)
            except SandboxError as exc:
                log.warning("sandbox %s: %s", sid, exc)
            finally:
                self._busy.discard(sid)

        return self._workers.submit(run)

    def _replace(self, live: Live) -> None:
        with self.provider.sandboxes.lock(live.row.id):
            self.provider.sandboxes.stop_pod(live)
        self.provider.resume(live.row.id)
