"""The Kubernetes provider: each sandbox a Pod running our guest agent, reached by its
Pod IP with a per-sandbox token; /workspace a PersistentVolumeClaim.

Commands, files, terminals and code cells are the embedded engine's own code (GuestOps,
DirOps, Terminals over ``PodSandboxes``): only where a sandbox lives differs.

- pause: the Pod is deleted, the volume kept (memory is not kept); resume: a new Pod on
  the same volume; reset_rootfs: a new Pod (a fresh image root), same volume.
- kill keeps the volume unless asked (``delete_volume``); ``create(volume=...)``
  attaches a kept one again.
- idle timeouts, lost Pods and the warm pool are the supervisor's (``supervisor.py``).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

from agent_sandbox.errors import InvalidArgumentError, NotFoundError, WrongStateError
from agent_sandbox.models import SandboxInfo, TemplateInfo, VolumeInfo
from agent_sandbox.netpolicy import NetworkSpec, parse
from agent_sandbox.providers.kubernetes import objects
from agent_sandbox.providers.kubernetes.catalog import Catalog
from agent_sandbox.providers.kubernetes.cluster import Cluster, Conflict, timestamp
from agent_sandbox.providers.kubernetes.config import ClusterConfig
from agent_sandbox.providers.kubernetes.pods import VISIBLE, Live, PodSandboxes
from agent_sandbox.runtime import validate
from agent_sandbox.runtime.config import EngineConfig, Limits
from agent_sandbox.runtime.guest_dirs import DirOps
from agent_sandbox.runtime.guest_ops import GuestOps
from agent_sandbox.runtime.pool import new_id
from agent_sandbox.runtime.port_forward import PortForwards
from agent_sandbox.runtime.store import SandboxRow, SandboxState
from agent_sandbox.runtime.terminals import Terminals
from agent_sandbox.settings import Settings


class KubernetesProvider(GuestOps, DirOps, Terminals):
    def __init__(self, cluster_config: ClusterConfig, settings: Settings) -> None:
        self.cluster_config = cluster_config
        self.config = EngineConfig.from_settings(settings)
        self.cluster = Cluster(cluster_config)
        self.catalog = Catalog(self.cluster.core, cluster_config.namespace)
        self._stop = threading.Event()
        state = self.config.data_dir / "kubernetes" / cluster_config.namespace
        self._sandboxes = PodSandboxes(self.cluster, self.catalog, state, self._stop)
        self._sandboxes.resume_hook = self._resume_live
        self._ports = PortForwards(lambda sandbox_id: self._sandboxes.guest(sandbox_id))
        from agent_sandbox.providers.kubernetes.supervisor import Supervisor

        self.supervisor = Supervisor(self, self._stop)
        self.supervisor.start()

    def close(self) -> None:
        self._stop.set()
        self._ports.close()
        self._sandboxes.code.close()

    # lifecycle --------------------------------------------------------------------------
    def create(self, template: str = "base", timeout: float = 300,
               envs: dict[str, str] | None = None, cpu: float | None = None,
               memory_mb: int | None = None, disk_mb: int | None = None,
               network: NetworkSpec = False, persistent: bool = False,
               metadata: dict[str, str] | None = None, volume: str | None = None,
               owner: str = "") -> SandboxInfo:
        tmpl, image = self.catalog.get(template)
        limits = _limits(self.config.limits, cpu, memory_mb, disk_mb)
        timeout = validate.positive(timeout, "timeout", allow_none=False, maximum=30 * 86400)
        if not isinstance(persistent, bool):
            raise InvalidArgumentError("persistent must be true or false")
        policy = _cluster_policy(network)
        envs = validate.envs(envs)
        metadata = validate.metadata(metadata)
        now = time.time()
        claim = dict(timeout=float(timeout), persistent=persistent, envs=envs,
                     metadata=metadata, owner=owner, created_at=now, last_used=now)
        if volume is None and policy.mode == "off" and limits == self.config.limits:
            claimed = self.supervisor.pool.claim(tmpl.name, claim)
            if claimed is not None:
                return self._info(claimed)
        if volume is not None and not isinstance(volume, str):
            raise InvalidArgumentError("volume must be a volume id such as 'vol-...'")
        sandbox_id = new_id()
        row = SandboxRow(id=sandbox_id, template=tmpl.name, state=SandboxState.RUNNING,
                         network=policy, volume_id=volume or f"vol-{sandbox_id[4:]}",
                         limits=limits.__dict__, **claim)  # type: ignore[arg-type]
        live = self.make(row, image, new_volume=volume is None)
        return self._info(live)

    def make(self, row: SandboxRow, image: str, *, new_volume: bool,
             state: str = SandboxState.RUNNING) -> Live:
        """Every object of a new sandbox, its Pod running; undone on any failure."""
        with self._sandboxes.activity.busy(row.id):  # never idle while being made
            return self._make(row, image, new_volume=new_volume, state=state)

    def _make(self, row: SandboxRow, image: str, *, new_volume: bool, state: str) -> Live:
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
            live = self._sandboxes.load(row.id)  # the token as the cluster holds it
            return self._sandboxes.start_pod(live, image, **self._pod_options())
        except BaseException:
            for kind, name in reversed(made):
                cluster.delete(kind, name)
            if not new_volume:
                self._release_volume(row.volume_id, row.id)
            self._sandboxes.forget(row.id)
            raise

    def _pod_options(self) -> dict[str, Any]:
        return {"pull_policy": self.cluster_config.image_pull_policy,
                "runtime_class": self.cluster_config.runtime_class}

    def info(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self._sandboxes.live(sandbox_id, fresh=True))

    def _info(self, live: Live) -> SandboxInfo:
        r = live.row
        return SandboxInfo(
            sandbox_id=r.id, template=r.template, state=live.state, created_at=r.created_at,
            last_used=r.last_used, timeout=r.timeout, persistent=r.persistent,
            network=r.network, volume_id=r.volume_id, metadata=r.metadata, envs=r.envs,
            limits=r.limits, enforced=self._sandboxes.enforced, owner=r.owner)

    def list(self, template: str | None = None, state: str | None = None,
             owner: str | None = None) -> list[SandboxInfo]:
        if state is not None and state not in VISIBLE:
            raise InvalidArgumentError(f"state must be 'running' or 'paused', got {state!r}")
        return [self._info(live) for live in self._sandboxes.load_all()
                if live.state in VISIBLE
                and (template is None or live.row.template == template)
                and (state is None or live.state == state)
                and (owner is None or live.row.owner == owner)]

    def pause(self, sandbox_id: str) -> SandboxInfo:
        """The Pod is deleted; the volume (and the record) stay. Memory is not kept."""
        with self._sandboxes.lock(sandbox_id):
            live = self._sandboxes.live(sandbox_id, fresh=True)
            if live.state != SandboxState.PAUSED:
                live = self._sandboxes.save(live, SandboxState.PAUSED)
            self._sandboxes.stop_pod(live)
        return self._info(live)

    def resume(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self._resume_live(sandbox_id))

    def _resume_live(self, sandbox_id: str) -> Live:
        with self._sandboxes.lock(sandbox_id):
            live = self._sandboxes.live(sandbox_id, fresh=True)
            if live.state == SandboxState.RUNNING and live.ip:
                return live
            _, image = self.catalog.get(live.row.template)
            live.row.last_used = time.time()
            if live.state != SandboxState.RUNNING:
                live = self._sandboxes.save(live, SandboxState.RUNNING)
            return self._sandboxes.start_pod(live, image, **self._pod_options())

    def reset_rootfs(self, sandbox_id: str) -> SandboxInfo:
        """A new Pod from the template's image: every change outside /workspace is gone."""
        with self._sandboxes.lock(sandbox_id):
            live = self._sandboxes.live(sandbox_id, fresh=True)
            _, image = self.catalog.get(live.row.template)
            self._sandboxes.stop_pod(live)
            live.row.last_used = time.time()
            live = self._sandboxes.save(live, SandboxState.RUNNING)
            live = self._sandboxes.start_pod(live, image, **self._pod_options())
        return self._info(live)

    def set_timeout(self, sandbox_id: str, timeout: float) -> None:
        timeout = validate.positive(timeout, "timeout", allow_none=False, maximum=30 * 86400)
        self._update(sandbox_id, timeout=float(timeout), last_used=time.time())

    def set_network(self, sandbox_id: str, network: NetworkSpec) -> None:
        policy = _cluster_policy(network)
        live = self._update(sandbox_id, network=policy)
        manifest = objects.network_policy(live.row)
        manifest["metadata"]["ownerReferences"] = [objects.owned_by(
            {"metadata": {"name": objects.secret_name(sandbox_id), "uid": live.secret_uid}})]
        self.cluster.replace_network_policy(manifest)

    def _update(self, sandbox_id: str, **fields: Any) -> Live:
        with self._sandboxes.lock(sandbox_id):
            for _ in range(5):
                live = self._sandboxes.live(sandbox_id, fresh=True)
                for name, value in fields.items():
                    setattr(live.row, name, value)
                try:
                    return self._sandboxes.save(live)
                except Conflict:
                    continue
        raise WrongStateError(f"sandbox {sandbox_id} kept changing; try again")

    def expose_port(self, sandbox_id: str, port: int) -> str:
        self._sandboxes.row(sandbox_id)
        return f"http://{self._ports.expose(sandbox_id, port)}"

    def kill(self, sandbox_id: str, delete_volume: bool = False) -> None:
        self._ports.close(sandbox_id)
        with self._sandboxes.lock(sandbox_id):
            live = self._sandboxes.live(sandbox_id, fresh=True)
            self.destroy(live, delete_volume=delete_volume)

    def destroy(self, live: Live, *, delete_volume: bool) -> None:
        sid = live.row.id
        self._sandboxes.code.forget(sid, keep_contexts=False)
        self._sandboxes.stop_pod(live)
        self.cluster.delete("NetworkPolicy", objects.pod_name(sid))
        self.cluster.delete("Secret", objects.secret_name(sid))
        if delete_volume:
            self._delete_volume_objects(live.row.volume_id)
        else:
            self._release_volume(live.row.volume_id, sid)
        self._sandboxes.forget(sid)

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

    def list_volumes(self) -> list[VolumeInfo]:
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
        found = {v.volume_id: v for v in self.list_volumes()}.get(volume_id)
        if found is None:
            raise NotFoundError(f"volume {volume_id!r} not found")
        if found.attached_to:
            raise WrongStateError(f"volume {volume_id} is attached to {found.attached_to}")
        self._delete_volume_objects(volume_id)

    # templates and the host -------------------------------------------------------------
    def list_templates(self) -> list[TemplateInfo]:
        from agent_sandbox.providers.kubernetes.catalog import template_of

        return [TemplateInfo(name=name, kind="image", description=t.description, env=t.env,
                             workdir=t.workdir, commands=t.commands,
                             has_kernel=t.kernel is not None, created_at=t.created_at)
                for name, data in sorted(self.catalog.entries(refresh=True).items())
                for t in [template_of(name, data)]]

    def disk_headroom(self) -> dict[str, int] | None:
        return None  # volumes are the cluster's storage, not this host's

    def drain_pool(self) -> int:
        return self.supervisor.pool.drain()

    def reap_once(self, now: float | None = None) -> None:
        """One pass of the supervisor now: idle timeouts, lost Pods, the warm pool."""
        self.supervisor.pass_once(now, wait=True)

    def engine_info(self) -> dict[str, Any]:
        return {"mode": "kubernetes", "namespace": self.cluster_config.namespace,
                "kubeconfig": self.cluster_config.kubeconfig or "in-cluster"}


def _limits(defaults: Limits, cpu: Any, memory_mb: Any, disk_mb: Any) -> Limits:
    limits = Limits(
        memory_mb=validate.positive(memory_mb, "memory_mb", integer=True, maximum=1 << 20)
        or defaults.memory_mb,
        cpu=validate.positive(cpu, "cpu", maximum=256) or defaults.cpu,
        pids=defaults.pids,
        disk_mb=validate.positive(disk_mb, "disk_mb", integer=True, maximum=1 << 22)
        or defaults.disk_mb)
    if limits.memory_mb < 32:
        raise InvalidArgumentError("memory_mb must be at least 32")
    if limits.disk_mb < 16:
        raise InvalidArgumentError("disk_mb must be at least 16")
    return limits


def _cluster_policy(network: NetworkSpec) -> Any:
    policy = parse(network)
    names = objects.names_in(policy)
    if names:
        raise InvalidArgumentError(
            f"a Kubernetes NetworkPolicy allows or denies addresses, not names: {names[:5]} "
            "cannot be enforced on a cluster; give CIDRs (e.g. '203.0.113.0/24'), 'full' "
            "or 'off'")
    return policy


def _mib(quantity: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1 << 20}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[:-2]) * factor)
    try:
        return int(float(quantity) / (1 << 20))
    except ValueError:
        return 0
