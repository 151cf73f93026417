"""The sandboxes of one namespace as the provider sees them, and the guest of each.

A sandbox's truth is in the cluster: its Secret (record, token, state label) and its Pod
(address). What is cached here is only what a fresh read gives back; a call that finds
the cache stale (the Pod moved or went away) reads the cluster again. Lifecycle steps
hold a per-sandbox lock of this process; between processes, state changes are
conditional on the Secret's resourceVersion.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent_sandbox.backends.kubernetes import objects
from agent_sandbox.backends.kubernetes.catalog import Catalog
from agent_sandbox.backends.kubernetes.cluster import Cluster, pod_problem
from agent_sandbox.core import validate
from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import VISIBLE, SandboxState
from agent_sandbox.guestlink.client import (
    GuestClient,
    GuestUnavailableError,
)
from agent_sandbox.service.backend import ServiceHooks
from agent_sandbox.service.record import SandboxRecord

START_TIMEOUT = 120.0  # a Pod on a busy node pulling nothing: seconds until it runs
_READY_TIMEOUT = 30.0  # after the container runs, until its guest answers
_TOUCH_EVERY = 30.0  # last_used is written to the cluster at most this often


@dataclass
class Live:
    row: SandboxRecord
    token: str
    state: str
    secret_uid: str
    version: str  # the Secret's resourceVersion
    pod: str | None = None
    ip: str | None = None
    node: str | None = None
    failed: bool = False  # it has Pods, none of which can run (evicted, failed, deleted)


def row_of(secret: dict[str, Any]) -> SandboxRecord:
    meta = secret["metadata"]
    data = json.loads((meta.get("annotations") or {})[objects.RECORD])
    return SandboxRecord(
        id=data["id"], template=data["template"],
        state=SandboxState((meta.get("labels") or {}).get(objects.LABEL_STATE, "running")),
        created_at=float(data["created_at"]), last_used=float(data["last_used"]),
        timeout=float(data["timeout"]), persistent=bool(data["persistent"]),
        network=NetworkPolicy.model_validate(data["network"]),
        volume_id=data["volume_id"], envs=dict(data.get("envs") or {}),
        metadata=dict(data.get("metadata") or {}), limits=dict(data.get("limits") or {}),
        owner=str(data.get("owner") or ""),
        lifetime=None if data.get("lifetime") is None else float(data["lifetime"]),
        on_timeout=str(data.get("on_timeout") or "pause"),
        keep_volume=bool(data.get("keep_volume", True)))


def live_of(secret: dict[str, Any], pods: list[dict[str, Any]]) -> Live:
    import base64

    row = row_of(secret)
    token = base64.b64decode((secret.get("data") or {}).get(objects.TOKEN_KEY, "")).decode()
    meta = secret["metadata"]
    live = Live(row=row, token=token, state=row.state, secret_uid=meta["uid"],
                version=meta["resourceVersion"])
    usable = [p for p in pods if pod_problem(p) is None]
    live.failed = bool(pods) and not usable
    if usable:
        newest = max(usable, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        live.pod = newest["metadata"]["name"]
        live.ip = (newest.get("status") or {}).get("podIP")
        live.node = (newest.get("spec") or {}).get("nodeName")
    return live


class PodSandboxes:
    """The sandboxes of one namespace: records, Pods, and a client of each guest."""

    def __init__(self, cluster: Cluster, catalog: Catalog, state_dir: Path) -> None:
        self.cluster = cluster
        self.catalog = catalog
        self.state_dir = state_dir
        self.hooks: ServiceHooks | None = None  # the service's, given at bind
        self.enforced = {"memory": True, "cpu": True, "disk": False}
        self._live: dict[str, Live] = {}
        self._used: dict[str, float] = {}  # last use seen by this process
        self._written: dict[str, float] = {}  # last_used as the cluster has it
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    # the record -------------------------------------------------------------------------
    def lock(self, sandbox_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(sandbox_id, threading.Lock())

    def load(self, sandbox_id: str) -> Live:
        """Read the sandbox from the cluster (NotFoundError if it has no record)."""
        try:
            secret = self.cluster.get("Secret", objects.secret_name(sandbox_id))
        except NotFoundError:
            with self._guard:
                self._live.pop(sandbox_id, None)
            raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)"
                                ) from None
        pods = self.cluster.list("Pod", f"{objects.LABEL_SANDBOX}={sandbox_id}")
        return self.remember(live_of(secret, pods))

    def load_all(self) -> list[Live]:
        """Every sandbox of the namespace (pooled ones too), two list calls."""
        secrets_ = self.cluster.list("Secret", f"{objects.LABEL_ROLE}=sandbox")
        pods: dict[str, list[dict[str, Any]]] = {}
        for pod in self.cluster.list("Pod", objects.LABEL_SANDBOX):
            sid = (pod["metadata"].get("labels") or {}).get(objects.LABEL_SANDBOX, "")
            pods.setdefault(sid, []).append(pod)
        found = []
        for secret in secrets_:
            sid = (secret["metadata"].get("labels") or {}).get(objects.LABEL_SANDBOX, "")
            try:
                found.append(self.remember(live_of(secret, pods.get(sid, []))))
            except (KeyError, ValueError, TypeError):
                continue  # not a record of ours (or damaged): never fatal to a listing
        return found

    def remember(self, live: Live) -> Live:
        with self._guard:
            self._written[live.row.id] = max(self._written.get(live.row.id, 0.0),
                                             live.row.last_used)
            used = self._used.get(live.row.id)
            if used and used > live.row.last_used:
                live.row.last_used = used
            self._live[live.row.id] = live
        return live

    def forget(self, sandbox_id: str) -> None:
        with self._guard:
            self._live.pop(sandbox_id, None)
            self._used.pop(sandbox_id, None)
            self._written.pop(sandbox_id, None)

    def live(self, sandbox_id: str, fresh: bool = False) -> Live:
        validate.sandbox_id(sandbox_id)
        with self._guard:
            live = None if fresh else self._live.get(sandbox_id)
        live = live or self.load(sandbox_id)
        if live.state not in VISIBLE:
            raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)")
        return live

    def row(self, sandbox_id: str) -> SandboxRecord:
        return self.live(sandbox_id).row

    def save(self, live: Live, state: str | None = None) -> Live:
        """Write the record (and state) back, if the Secret is still the version read."""
        state = state or live.state
        body = {"metadata": {
            "resourceVersion": live.version,
            "labels": {objects.LABEL_STATE: state},
            "annotations": {objects.RECORD: objects.record_json(live.row)}}}
        secret = self.cluster.patch("Secret", objects.secret_name(live.row.id), body)
        live.version = secret["metadata"]["resourceVersion"]
        live.state = state
        live.row = replace(live.row, state=SandboxState(state))
        return self.remember(live)

    def touch(self, sandbox_id: str) -> None:
        now = time.time()
        with self._guard:
            self._used[sandbox_id] = now
            live = self._live.get(sandbox_id)
            if live is not None:
                live.row.last_used = now

    def unsaved_use(self) -> dict[str, float]:
        """Sandboxes whose last use is newer than the cluster's record by _TOUCH_EVERY."""
        with self._guard:
            return {sid: t for sid, t in self._used.items()
                    if t - self._written.get(sid, 0.0) > _TOUCH_EVERY}

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.state_dir / sandbox_id

    # pods -------------------------------------------------------------------------------
    def start_pod(self, live: Live, image: str, *, pull_policy: str, runtime_class: str
                  ) -> Live:
        """A new Pod for the sandbox (its previous one, if any, deleted first), running
        and answering; its address remembered."""
        if live.pod:
            self.cluster.delete("Pod", live.pod)
        manifest = objects.pod(live.row, image, pull_policy=pull_policy,
                               runtime_class=runtime_class)
        name = f"{objects.pod_name(live.row.id)}-{secrets.token_hex(3)}"
        manifest["metadata"]["name"] = name
        manifest["metadata"]["ownerReferences"] = [objects.owned_by(
            {"metadata": {"name": objects.secret_name(live.row.id), "uid": live.secret_uid}})]
        self.cluster.create(manifest)
        try:
            # Busy while it starts: a short idle timeout must not pause it meanwhile.
            assert self.hooks is not None
            with self.hooks.activity.busy(live.row.id):
                pod = self.cluster.wait_running(name, START_TIMEOUT)
                live.pod, live.ip = name, pod["status"]["podIP"]
                self.address_client(live, connect_timeout=1.0).wait_ready(_READY_TIMEOUT)
        except BaseException:
            self.cluster.delete("Pod", name)
            live.pod = live.ip = None
            raise
        self.remember(live)
        self.touch(live.row.id)  # its idle time starts now
        return live

    def stop_pod(self, live: Live) -> None:
        assert self.hooks is not None
        self.hooks.guest_gone(live.row.id)
        for pod in self.cluster.list("Pod", f"{objects.LABEL_SANDBOX}={live.row.id}"):
            self.cluster.delete("Pod", pod["metadata"]["name"])
        live.pod = live.ip = None

    # the guest --------------------------------------------------------------------------
    def address_client(self, live: Live, **kw: Any) -> GuestClient:
        if not live.ip:
            raise GuestUnavailableError(f"sandbox {live.row.id} has no running pod")
        return GuestClient((live.ip, objects.GUEST_PORT), token=live.token, **kw)

    def client(self, sandbox_id: str) -> GuestClient:
        return self.address_client(self.live(sandbox_id))

    resume_hook: Callable[[str], Live] | None = None  # the backend's resume

    def guest(self, sandbox_id: str, row: SandboxRecord | None = None) -> GuestClient:
        """A client of a running sandbox: resumes a paused one, extends its life."""
        live = self.live(sandbox_id)
        if live.state == SandboxState.PAUSED or not live.ip:
            assert self.resume_hook is not None
            live = self.resume_hook(sandbox_id)
        self.touch(sandbox_id)
        return self.address_client(live)
