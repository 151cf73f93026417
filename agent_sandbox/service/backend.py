"""The seam between the service and where sandboxes run.

The service (``service.SandboxService``) implements the Provider once: it checks every
input, owns listing and ownership, timeouts and the reaper's decisions, the warm pool's
policy, the calls into a sandbox (commands, files, terminals, code) and the kernels. A
backend does only what differs: keeping records, starting and stopping sandboxes, and
reaching a sandbox's guest. runc containers on this host (``backends/runc``) and Pods of
a cluster (``backends/kubernetes``) are backends; a third (another isolation tier, memory
snapshots) plugs in here without touching any surface.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError
from agent_sandbox.core.metrics import Usage
from agent_sandbox.core.models import SnapshotInfo, TemplateInfo, VolumeInfo
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.templates import Template
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.service.activity import Activity
from agent_sandbox.service.record import SandboxRecord

if TYPE_CHECKING:
    from agent_sandbox.service import lifecycle
    from agent_sandbox.service.code.files import KernelFiles, KernelHost


class ServiceHooks(Protocol):
    """What a backend may ask of the service above it (given once, by ``bind``)."""

    activity: Activity  # busy() while a backend starts a sandbox; active() for its sweeps

    def guest_gone(self, sandbox_id: str, *, keep_contexts: bool = True) -> None:
        """The sandbox's processes ended (stop, reset, kill): its kernels with them."""
        ...

    def decide(self, record: SandboxRecord, now: float) -> lifecycle.Step | None:
        """The reaper's decision for a sandbox now (for a backend that acts on it)."""
        ...

    def next_change(self, record: SandboxRecord) -> float | None:
        """When the reaper's decision for it may next change (``lifecycle.next_change``)."""
        ...

    def wait_reap(self, due: float | None, longest: float, gap: float = ...) -> bool:
        """Sleep until ``due``, at most ``longest`` s, or a change (not sooner than ``gap``
        s after the last pass); True: closing."""
        ...

    def pooled(self, record: SandboxRecord) -> None:
        """A warm sandbox nobody has yet was made: get it ready for a first call (its
        default code kernel started, when its template has one)."""
        ...

    def end(self, record: SandboxRecord, step: lifecycle.Step) -> None:
        """End a sandbox as ``step`` says (its volume as it asked; the audit log)."""
        ...


class Backend(Protocol):
    name: str  # "runc", "kubernetes"
    # Which limits the backend really enforces ({"memory": True, "disk": False, ...}).
    enforced: dict[str, bool]
    # Who owns the files the host makes for a sandbox's root (None: this process's user).
    sandbox_owner: int | None

    def bind(self, hooks: ServiceHooks) -> None:
        """Called once by the service, before anything else."""
        ...

    def close(self) -> None: ...

    # records ------------------------------------------------------------------------------
    def record(self, sandbox_id: str) -> SandboxRecord:
        """A live (running or paused) sandbox's record; NotFoundError otherwise."""
        ...

    def records(self) -> list[SandboxRecord]:
        """Every record, whatever its state (pooled and half-made ones too)."""
        ...

    def update(self, sandbox_id: str, **fields: Any) -> None:
        """Change fields of a live sandbox's record (timeout, last_used, ...)."""
        ...

    def touch(self, sandbox_id: str) -> None:
        """It was used now (written back lazily where writes are dear)."""
        ...

    # what a create needs ------------------------------------------------------------------
    def template(self, name: str, *, creating: bool = False) -> Template:
        """A template's metadata (NotFoundError if there is none of that name);
        ``creating``: a sandbox starts from it now (a backend may build it first)."""
        ...

    def list_templates(self) -> list[TemplateInfo]: ...

    def import_template(self, name: str, source: str, *, replace: bool = False,
                        **meta: Any) -> TemplateInfo: ...

    def build_template(self, name: str, *, index_url: str | None, force: bool,
                       progress: Callable[[str], None] | None) -> tuple[TemplateInfo, str]: ...

    def remove_template(self, name: str) -> None: ...

    # recipe builds (service/recipes.py); a backend without them refuses, saying so
    def recipes(self) -> Any:
        """Its recipe layer store: has, compose, copy_in, mkdir, owner, from_image,
        capture, save, building, prune (backends/runc/templates/recipe_layers.py)."""
        ...

    def template_exists(self, name: str) -> bool: ...

    def template_info(self, tmpl: Template) -> TemplateInfo: ...

    def capture_layer(self, sandbox_id: str, key: str) -> None:
        """A build step's layer out of the sandbox (frozen first), as layer ``key``."""
        ...

    def prune_layers(self) -> tuple[int, int]: ...

    def limit_caps(self) -> dict[str, tuple[float, str]]:
        """The most one sandbox may have of a limit, and what that is, by create option
        ({"cpu": (2, "this host's CPUs")}); a limit not named has only its spec bound."""
        ...

    def check_network(self, policy: NetworkPolicy) -> None:
        """Refuse a policy this backend cannot enforce (with the reason)."""
        ...

    def creating(self) -> AbstractContextManager[None]:
        """Around a create that is not served from the warm pool."""
        ...

    def claim_pooled(self, record: SandboxRecord) -> str | None:
        """A warm sandbox of ``record.template``, now ``record``'s (its id kept), or None."""
        ...

    def make(self, record: SandboxRecord, template: Template, *, new_volume: bool) -> None:
        """Make and start the sandbox of ``record`` (state CREATING) on a new volume or on
        the kept one it names; undone whole on any failure."""
        ...

    def drain_pool(self) -> int: ...

    # lifecycle ----------------------------------------------------------------------------
    def pause(self, sandbox_id: str) -> None: ...

    def resume(self, sandbox_id: str) -> None: ...

    def release(self, sandbox_id: str) -> None:
        """A paused sandbox's memory back (its processes end, its disk stays): the
        reaper's step for one paused long."""
        ...

    def reset_rootfs(self, sandbox_id: str) -> None: ...

    def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> None: ...

    def kill(self, sandbox_id: str, *, delete_volume: bool) -> None: ...

    def reaping(self) -> bool:
        """Whether the service's reaper thread keeps the idle timeouts in this process
        (False: none here, or the backend acts on ``lifecycle.decide`` itself)."""
        ...

    def maintain(self) -> None:
        """The backend's own periodic upkeep (the warm pool, lost Pods, base views)."""
        ...

    # the guest ------------------------------------------------------------------------------
    def guest(self, sandbox_id: str, record: SandboxRecord | None = None) -> GuestClient:
        """A client of the running sandbox: resumes a paused one, counts as a use."""
        ...

    def client(self, sandbox_id: str) -> GuestClient:
        """A client of the sandbox's guest as it is (no resume)."""
        ...

    def replace_guest(self, sandbox_id: str, failed: GuestClient) -> GuestClient | None:
        """``failed`` could not reach the guest: a client of the sandbox started again if
        it is gone (crashed, its Pod lost); None if it still runs (a busy guest)."""
        ...

    def stop_misbehaving(self, sandbox_id: str) -> None:
        """Stop a sandbox whose guest broke the protocol (its next use boots it)."""
        ...

    def guest_env(self, record: SandboxRecord) -> dict[str, str]:
        """What the backend adds to every command's environment (a proxy's address)."""
        ...

    def kernel_files(self, host: KernelHost) -> KernelFiles: ...

    def sandbox_dir(self, sandbox_id: str) -> Path:
        """Host-only state of the sandbox (never inside what the sandbox can write)."""
        ...

    # memory snapshots ---------------------------------------------------------------------
    def take_snapshot(self, sandbox_id: str, snapshot_id: str, name: str,
                      owner: str) -> SnapshotInfo:
        """The sandbox's processes, memory and files now, kept as ``snapshot_id``; the
        sandbox runs on (stopped only for the checkpoint)."""
        ...

    def snapshots(self) -> list[SnapshotInfo]: ...

    def snapshot_source(self, snapshot_id: str) -> tuple[SnapshotInfo, SandboxRecord]:
        """A snapshot and the record of its sandbox as it was (NotFoundError if none)."""
        ...

    def delete_snapshot(self, snapshot_id: str) -> None: ...

    def make_from_snapshot(self, record: SandboxRecord, snapshot_id: str) -> None:
        """Make and start ``record``'s sandbox from a snapshot (a copy of its files, its
        processes restored); undone whole on any failure."""
        ...

    # volumes and the host -------------------------------------------------------------------
    def volumes(self) -> list[VolumeInfo]: ...

    def delete_volume(self, volume_id: str) -> None: ...

    def disk_headroom(self) -> dict[str, int] | None: ...

    def usage(self, sandbox_id: str) -> Usage:
        """A running sandbox's CPU time, memory and disk now (from its cgroup and its
        disk); ``RuntimeUnavailableError`` where this backend cannot read them."""
        ...

    def describe(self) -> dict[str, Any]: ...

    def release_host(self) -> None:
        """Leave nothing of this backend running or mounted on the host (an uninstall):
        WrongStateError while a sandbox exists."""
        ...

    def leftovers(self) -> list[str]:
        """What of this backend is still mounted on the host (none after release_host)."""
        ...


class NoSnapshots:
    """What a backend that cannot keep a sandbox's memory answers to snapshot calls."""

    snapshot_refusal = "memory snapshots are not available on this backend"

    def take_snapshot(self, sandbox_id: str, snapshot_id: str, name: str,
                      owner: str) -> SnapshotInfo:
        raise RuntimeUnavailableError(self.snapshot_refusal)

    def snapshots(self) -> list[SnapshotInfo]:
        return []

    def snapshot_source(self, snapshot_id: str) -> tuple[SnapshotInfo, SandboxRecord]:
        raise NotFoundError(f"snapshot {snapshot_id} not found ({self.snapshot_refusal})")

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshot_source(snapshot_id)

    def make_from_snapshot(self, record: SandboxRecord, snapshot_id: str) -> None:
        self.snapshot_source(snapshot_id)
