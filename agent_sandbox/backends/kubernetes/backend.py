"""The Kubernetes backend: each sandbox a Pod running our guest agent, reached by its
Pod IP with a per-sandbox token; /workspace a PersistentVolumeClaim.

Commands, files, terminals and code cells are the service's, as for every backend: only
where a sandbox lives differs.

- pause: the Pod is deleted, the volume kept (memory is not kept); resume: a new Pod on
  the same volume; reset_rootfs: a new Pod (a fresh image root), same volume.
- kill keeps the volume unless asked (``delete_volume``); ``create(volume=...)``
  attaches a kept one again.
- idle timeouts, lost Pods and the warm pool are the supervisor's (``supervisor.py``).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.kubernetes import objects
from agent_sandbox.backends.kubernetes.catalog import Catalog, template_of
from agent_sandbox.backends.kubernetes.cluster import Cluster, Conflict, timestamp
from agent_sandbox.backends.kubernetes.config import ClusterConfig
from agent_sandbox.backends.kubernetes.kernel_files import GuestKernelFiles
from agent_sandbox.backends.kubernetes.pods import Live, PodSandboxes
from agent_sandbox.backends.kubernetes.supervisor import Supervisor
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.config.settings import Settings
from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError, WrongStateError
from agent_sandbox.core.metrics import Usage
from agent_sandbox.core.models import TemplateInfo, VolumeInfo
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.core.templates import Template
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.service.backend import NoSnapshots, ServiceHooks
from agent_sandbox.service.code.files import KernelFiles
from agent_sandbox.service.record import SandboxRecord, claimed_fields

if TYPE_CHECKING:
    from agent_sandbox.service.code.files import KernelHost


# A cluster's templates are images: built on a host's engine, then pushed.
_PUSH_RECIPE = ("recipe builds run on a runc engine: build the template there (`abx "
                 "template build NAME --file Dockerfile`), then `abx template push NAME`")
_PUSH = ("a cluster's templates are images: build the template with a local engine, then "
         "`abx template push NAME` (docs/kubernetes.md)")


class KubernetesBackend(NoSnapshots):
    # Pause deletes the Pod and keeps the volume: files only. (A cluster whose nodes
    # checkpoint containers could keep memory; this backend does not use that yet.)
    snapshot_refusal = ("the Kubernetes backend pauses files only (a paused sandbox's Pod "
                        "is deleted; its memory and processes are not kept) and cannot "
                        "snapshot or fork a sandbox's memory: use the runc engine (with "
                        "CRIU, scripts/setup.sh) for snapshots and fork")

    name = "kubernetes"
    sandbox_owner = None  # the host makes no files for a Pod

    def __init__(self, cluster_config: ClusterConfig, settings: Settings) -> None:
        self.cluster_config = cluster_config
        self.config = EngineConfig.from_settings(settings)
        self.cluster = Cluster(cluster_config)
        self.catalog = Catalog(self.cluster.core, cluster_config.namespace)
        self._stop = threading.Event()
        state = self.config.data_dir / "kubernetes" / cluster_config.namespace
        self.sandboxes = PodSandboxes(self.cluster, self.catalog, state)
        self.sandboxes.resume_hook = self._resume_live
        self.supervisor = Supervisor(self, self._stop)

    def bind(self, hooks: ServiceHooks) -> None:
        self.sandboxes.hooks = hooks
        self.supervisor.start()

    def pass_once(self, now: float | None = None) -> None:
        """One pass of the supervisor now: idle timeouts, lost Pods, the warm pool."""
        self.supervisor.pass_once(now, wait=True)

    @property
    def hooks(self) -> ServiceHooks:
        assert self.sandboxes.hooks is not None
        return self.sandboxes.hooks

    @property
    def enforced(self) -> dict[str, bool]:
        return self.sandboxes.enforced

    def close(self) -> None:
        self._stop.set()

    def reaping(self) -> bool:
        return False  # the supervisor acts on the reaper's decisions, on its workers

    def maintain(self) -> None:
        pass  # the supervisor's thread does it (lost Pods, the pool, last use)

    # records ------------------------------------------------------------------------------
    def record(self, sandbox_id: str) -> SandboxRecord:
        return self.sandboxes.row(sandbox_id)

    def records(self) -> list[SandboxRecord]:
        return [live.row for live in self.sandboxes.load_all()]

    def update(self, sandbox_id: str, **fields: Any) -> None:
        self._update(sandbox_id, **fields)

    def touch(self, sandbox_id: str) -> None:
        self.sandboxes.touch(sandbox_id)

    # what a create needs ------------------------------------------------------------------
    def template(self, name: str, *, creating: bool = False) -> Template:
        return self.catalog.get(name)[0]

    def limit_caps(self) -> dict[str, tuple[float, str]]:
        # Beyond a node's, the scheduler leaves the Pod pending; memory: the nodes decide.
        return {"cpu": (256, "the most CPUs a cluster node may have here")}

    def check_network(self, policy: NetworkPolicy) -> None:
        objects.check_enforceable(policy)

    @contextlib.contextmanager
    def creating(self) -> Iterator[None]:
        yield

    def claim_pooled(self, record: SandboxRecord) -> str | None:
        claim = {**claimed_fields(record), "created_at": record.created_at,
                 "last_used": record.last_used}
        live = self.supervisor.pool.claim(record.template, claim)
        return None if live is None else live.row.id

    def make(self, record: SandboxRecord, template: Template, *, new_volume: bool) -> None:
        _, image = self.catalog.get(template.name)
        record.state = SandboxState.RUNNING
        self.start_new(record, image, new_volume=new_volume)

    def start_new(self, row: SandboxRecord, image: str, *, new_volume: bool,
                  state: str = SandboxState.RUNNING) -> Live:
        """Every object of a new sandbox, its Pod running; undone on any failure."""
        with self.hooks.activity.busy(row.id):  # never idle while being made
            return self._make(row, image, new_volume=new_volume, state=state)

    def _make(self, row: SandboxRecord, image: str, *, new_volume: bool, state: str) -> Live:
        cluster, made = self.cluster, []
        try:
            secret = cluster.create(objects.secret(row, secrets.token_urlsafe(32), state))
            made.append(("Secret", objects.secret_name(row.id)))
            if new_volume:
                self._new_volume(row.volume_id, int(row.limits["disk_mb"]), row.id, made)
            else:
                self._attach_volume(row.volume_id, row.id)
            policy = objects.network_policy(row)
            policy["metadata"]["ownerReferences"] = [objects.owned_by(secret)]
            cluster.create(policy)
            made.append(("NetworkPolicy", objects.pod_name(row.id)))
            live = self.sandboxes.load(row.id)  # the token as the cluster holds it
            return self.sandboxes.start_pod(live, image, **self._pod_options())
        except BaseException:
            for kind, name in reversed(made):
                cluster.delete(kind, name)
            if not new_volume:
                self._release_volume(row.volume_id, row.id)
            self.sandboxes.forget(row.id)
            raise

    def _pod_options(self) -> dict[str, Any]:
        return {"pull_policy": self.cluster_config.image_pull_policy,
                "runtime_class": self.cluster_config.runtime_class}

    # lifecycle ----------------------------------------------------------------------------
    def pause(self, sandbox_id: str) -> None:
        """The Pod is deleted; the volume (and the record) stay. Memory is not kept."""
        with self.sandboxes.lock(sandbox_id):
            live = self.sandboxes.live(sandbox_id, fresh=True)
            if live.state != SandboxState.PAUSED:
                live = self.sandboxes.save(live, SandboxState.PAUSED)
            self.sandboxes.stop_pod(live)

    def resume(self, sandbox_id: str) -> None:
        self._resume_live(sandbox_id)

    def release(self, sandbox_id: str) -> None:
        pass  # a paused sandbox has no Pod: nothing holds memory

    def _resume_live(self, sandbox_id: str) -> Live:
        with self.sandboxes.lock(sandbox_id):
            live = self.sandboxes.live(sandbox_id, fresh=True)
            if live.state == SandboxState.RUNNING and live.ip:
                return live
            _, image = self.catalog.get(live.row.template)
            live.row.last_used = time.time()
            if live.state != SandboxState.RUNNING:
                live = self.sandboxes.save(live, SandboxState.RUNNING)
            return self.sandboxes.start_pod(live, image, **self._pod_options())

    def reset_rootfs(self, sandbox_id: str) -> None:
        """A new Pod from the template's image: every change outside /workspace is gone."""
        with self.sandboxes.lock(sandbox_id):
            live = self.sandboxes.live(sandbox_id, fresh=True)
            _, image = self.catalog.get(live.row.template)
            self.sandboxes.stop_pod(live)
            live.row.last_used = time.time()
            live = self.sandboxes.save(live, SandboxState.RUNNING)
            self.sandboxes.start_pod(live, image, **self._pod_options())

    def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        live = self._update(sandbox_id, network=policy)
        manifest = objects.network_policy(live.row)
        manifest["metadata"]["ownerReferences"] = [objects.owned_by(
            {"metadata": {"name": objects.secret_name(sandbox_id), "uid": live.secret_uid}})]
        self.cluster.replace_network_policy(manifest)

    def _update(self, sandbox_id: str, **fields: Any) -> Live:
        with self.sandboxes.lock(sandbox_id):
            for _ in range(5):
                live = self.sandboxes.live(sandbox_id, fresh=True)
                for name, value in fields.items():
                    setattr(live.row, name, value)
                try:
                    return self.sandboxes.save(live)
                except Conflict:
                    continue
        raise WrongStateError(f"sandbox {sandbox_id} kept changing; try again")

    def kill(self, sandbox_id: str, *, delete_volume: bool) -> None:
        with self.sandboxes.lock(sandbox_id):
            live = self.sandboxes.live(sandbox_id, fresh=True)
            self.destroy(live, delete_volume=delete_volume)

    def destroy(self, live: Live, *, delete_volume: bool) -> None:
        sid = live.row.id
        self.hooks.guest_gone(sid, keep_contexts=False)
        self.sandboxes.stop_pod(live)
        self.cluster.delete("NetworkPolicy", objects.pod_name(sid))
        self.cluster.delete("Secret", objects.secret_name(sid))
        if delete_volume:
            self._delete_volume_objects(live.row.volume_id)
        else:
            self._release_volume(live.row.volume_id, sid)
        self.sandboxes.forget(sid)

    # the guest ----------------------------------------------------------------------------
    def guest(self, sandbox_id: str, record: SandboxRecord | None = None) -> GuestClient:
        return self.sandboxes.guest(sandbox_id, record)

    def client(self, sandbox_id: str) -> GuestClient:
        return self.sandboxes.client(sandbox_id)

    def replace_guest(self, sandbox_id: str, failed: GuestClient) -> GuestClient | None:
        """A Pod the cluster reports gone or failed (evicted, its node lost) is replaced
        once, on the same volume; one that moved meanwhile is reached where it is now."""
        sandboxes = self.sandboxes
        live = sandboxes.live(sandbox_id, fresh=True)
        if live.ip and (live.ip, objects.GUEST_PORT) != failed.address:
            return sandboxes.address_client(live)  # it moved meanwhile
        if live.ip:  # the cluster says its Pod runs: the guest is busy (out of pids,
            return None  # say), not gone; replacing it would lose it all
        with sandboxes.lock(sandbox_id):
            sandboxes.stop_pod(live)  # gone: the next guest() starts a new one
        return sandboxes.guest(sandbox_id)

    def stop_misbehaving(self, sandbox_id: str) -> None:
        sandboxes = self.sandboxes
        with sandboxes.lock(sandbox_id):
            sandboxes.stop_pod(sandboxes.live(sandbox_id))

    def guest_env(self, record: SandboxRecord) -> dict[str, str]:
        return {}  # egress is a NetworkPolicy: no proxy to name

    def kernel_files(self, host: KernelHost) -> KernelFiles:
        return GuestKernelFiles(host)

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.sandboxes.sandbox_dir(sandbox_id)

    # volumes ----------------------------------------------------------------------------
    def _new_volume(self, volume_id: str, size_mb: int, sandbox_id: str,
                    made: list[tuple[str, str]]) -> None:
        c = self.cluster_config
        claim = self.cluster.create(objects.pvc(volume_id, size_mb, c.storage_class,
                                                sandbox_id, hostpath=bool(c.hostpath_dir)))
        made.append(("PersistentVolumeClaim", objects.pvc_name(volume_id)))
        if c.hostpath_dir:
            # Made after its claim and naming the claim's uid: the volume controller
            # binds the pair on the volume's event, not on its next periodic resync.
            self.cluster.create(objects.hostpath_pv(volume_id, size_mb, c.hostpath_dir,
                                                    c.namespace, claim["metadata"]["uid"]))
            made.append(("PersistentVolume", objects.pvc_name(volume_id)))

    def _attach_volume(self, volume_id: str, sandbox_id: str) -> None:
        """Claim a kept volume for ``sandbox_id``: only if nobody has it (conditional on
        the claim's version, so two creates cannot both get it)."""
        try:
            claim = self.cluster.get("PersistentVolumeClaim", objects.pvc_name(volume_id))
        except NotFoundError:
            raise NotFoundError(f"volume {volume_id!r} not found") from None
        meta = claim["metadata"]
        holder = (meta.get("annotations") or {}).get(objects.ATTACHED, "")
        if holder:
            raise WrongStateError(f"volume {volume_id!r} is attached to sandbox {holder}")
        try:
            self.cluster.patch("PersistentVolumeClaim", objects.pvc_name(volume_id), {
                "metadata": {"resourceVersion": meta["resourceVersion"],
                             "annotations": {objects.ATTACHED: sandbox_id}}})
        except Conflict:
            raise WrongStateError(f"volume {volume_id!r} is being attached elsewhere") from None

    def _release_volume(self, volume_id: str, sandbox_id: str) -> None:
        try:
            claim = self.cluster.get("PersistentVolumeClaim", objects.pvc_name(volume_id))
        except NotFoundError:
            return
        if (claim["metadata"].get("annotations") or {}).get(objects.ATTACHED) == sandbox_id:
            self.cluster.patch("PersistentVolumeClaim", objects.pvc_name(volume_id),
                               {"metadata": {"annotations": {objects.ATTACHED: ""}}})

    def _delete_volume_objects(self, volume_id: str) -> None:
        self.cluster.delete("PersistentVolumeClaim", objects.pvc_name(volume_id))
        if self.cluster_config.hostpath_dir:
            self.cluster.delete("PersistentVolume", objects.pvc_name(volume_id))

    def volumes(self) -> list[VolumeInfo]:
        found = []
        for claim in self.cluster.list("PersistentVolumeClaim", objects.LABEL_VOLUME):
            meta = claim["metadata"]
            if meta.get("deletionTimestamp"):
                continue  # deleted: the cluster finishes once no Pod holds it
            size = str((claim["spec"].get("resources") or {}).get("requests", {})
                       .get("storage", "0Mi"))
            found.append(VolumeInfo(
                volume_id=meta["labels"][objects.LABEL_VOLUME], size_mb=_mib(size),
                created_at=timestamp(meta.get("creationTimestamp")),
                attached_to=(meta.get("annotations") or {}).get(objects.ATTACHED, "")))
        return found

    def delete_volume(self, volume_id: str) -> None:
        found = {v.volume_id: v for v in self.volumes()}.get(volume_id)
        if found is None:
            raise NotFoundError(f"volume {volume_id!r} not found")
        if found.attached_to:
            raise WrongStateError(f"volume {volume_id} is attached to {found.attached_to}")
        self._delete_volume_objects(volume_id)

    # templates and the host -------------------------------------------------------------
    def list_templates(self) -> list[TemplateInfo]:
        return [TemplateInfo(name=name, kind="image", description=t.description, env=t.env,
                             workdir=t.workdir, commands=t.commands,
                             has_kernel=t.kernel is not None, languages=sorted(t.kernels()),
                             created_at=t.created_at)
                for name, data in sorted(self.catalog.entries(refresh=True).items())
                for t in [template_of(name, data)]]

    def import_template(self, name: str, source: str, *, replace: bool = False,
                        **meta: Any) -> TemplateInfo:
        raise WrongStateError(_PUSH)

    def build_template(self, name: str, *, index_url: str | None, force: bool,
                       progress: Callable[[str], None] | None) -> tuple[TemplateInfo, str]:
        raise WrongStateError(_PUSH)

    def remove_template(self, name: str) -> None:
        raise WrongStateError(_PUSH)

    def recipes(self) -> Any:
        raise WrongStateError(_PUSH_RECIPE)

    def template_exists(self, name: str) -> bool:
        return any(t.name == name for t in self.list_templates())

    def template_info(self, tmpl: Template) -> TemplateInfo:
        return TemplateInfo(name=tmpl.name, kind=tmpl.kind)

    def capture_layer(self, sandbox_id: str, key: str) -> None:
        raise WrongStateError(_PUSH_RECIPE)

    def prune_layers(self) -> tuple[int, int]:
        return 0, 0

    def release_host(self) -> None:
        pass  # sandboxes live in the cluster: nothing of them is on this host

    def leftovers(self) -> list[str]:
        return []

    def disk_headroom(self) -> dict[str, int] | None:
        return None  # volumes are the cluster's storage, not this host's

    def usage(self, sandbox_id: str) -> Usage:
        raise RuntimeUnavailableError(
            "the Kubernetes backend does not read a Pod's metrics yet: use the cluster's "
            "metrics-server (kubectl top pod)")

    def drain_pool(self) -> int:
        return self.supervisor.pool.drain()

    def describe(self) -> dict[str, Any]:
        return {"mode": "kubernetes", "namespace": self.cluster_config.namespace,
                "kubeconfig": self.cluster_config.kubeconfig or "in-cluster"}


def _mib(quantity: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1 << 20}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[:-2]) * factor)
    try:
        return int(float(quantity) / (1 << 20))
    except ValueError:
        return 0
