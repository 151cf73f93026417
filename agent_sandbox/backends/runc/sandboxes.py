"""Sandbox lifecycle on one host: make, pause, resume, reset, kill, and the guest client
of a running one. State lives in SQLite and the sandbox directories; each step
writes its intent first, so a crash at any point is finished by ``recovery``. Every step
holds the sandbox's lock (this process's threads and other processes alike)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_sandbox.backends.runc import checkpoint, criu, supervisor
from agent_sandbox.backends.runc.boot import Booter
from agent_sandbox.backends.runc.checkpoint import CheckpointError
from agent_sandbox.backends.runc.host.mode import HostMode
from agent_sandbox.backends.runc.rootfs.disk import check_free, has_room
from agent_sandbox.backends.runc.rootfs.overlay import SHARED
from agent_sandbox.backends.runc.runc import Runc
from agent_sandbox.backends.runc.sandbox_lock import LOCK_FILE, SandboxLock, held_elsewhere
from agent_sandbox.backends.runc.store import Store, VolumeRow
from agent_sandbox.backends.runc.templates.store import TemplateStore
from agent_sandbox.core import validate
from agent_sandbox.core.errors import NotFoundError, SandboxError, WrongStateError
from agent_sandbox.core.models import VolumeInfo
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import VISIBLE, SandboxState
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.service.backend import ServiceHooks
from agent_sandbox.service.record import SandboxRecord

_CONTROL_TIMEOUT = 10.0  # freeze/thaw answers, under the sandbox's lock
# last_used is written at most this often per sandbox: idle timeouts are seconds long,
# and a write per exec is a measurable share of a 5 ms round trip.
_TOUCH_EVERY = 1.0
NEW_PREFIX = ".new-"  # a sandbox dir being made, before its create lock is held
IMAGE = "checkpoint"  # a paused sandbox's memory checkpoint, in its host directory
SNAPSHOTS = "snapshots"  # the data dir's folder of snapshots (backends/runc/snapshots.py)
CREATE_LOCK = "create.lock"  # held by the process making the sandbox, for the whole create
_DONE = ".done-"  # a restored image being removed: checkpoint.done-<random>
DUMPING = "dumping"  # beside it while a checkpoint's outcome is not on disk yet


class Sandboxes:
    def __init__(self, mode: HostMode, runc: Runc, store: Store, templates: TemplateStore,
                 hooks: ServiceHooks, enforced: dict[str, bool]) -> None:
        self.mode = mode
        self.layout = mode.layout
        self.runc = runc
        self.store = store
        self.templates = templates
        self.hooks = hooks
        self.enforced = enforced
        self.booter = Booter(mode, runc, store)
        self._locks: dict[str, SandboxLock] = {}
        self._locks_guard = threading.Lock()

    # where things are ---------------------------------------------------
    @property
    def sandbox_owner(self) -> int | None:
        return self.mode.sandbox_owner

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.layout.sandbox_dir(sandbox_id)

    def socket(self, sandbox_id: str) -> str:
        return self.layout.socket(sandbox_id)

    def client(self, sandbox_id: str) -> GuestClient:
        return GuestClient(self.socket(sandbox_id))

    def touch(self, sandbox_id: str) -> None:
        self.store.touch(sandbox_id)

    def lock(self, sandbox_id: str) -> SandboxLock:
        """The sandbox's lifecycle lock: this process's threads and other processes."""
        with self._locks_guard:
            lock = self._locks.get(sandbox_id)
            if lock is None:
                lock = self._locks[sandbox_id] = SandboxLock(sandbox_id,
                                                             self.sandbox_dir(sandbox_id))
            return lock

    def row(self, sandbox_id: str) -> SandboxRecord:
        validate.sandbox_id(sandbox_id)
        row = self.store.get_sandbox(sandbox_id)
        if row is None or row.state not in VISIBLE:
            raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)")
        return row

    # make and destroy -------------------------------------------------------------------
    def make(self, row: SandboxRecord, *, new_volume: bool, final_state: str,
             start: Callable[[SandboxRecord], None] | None = None) -> None:
        """Create the sandbox of ``row``: on a new volume, or on the kept one it names
        (claimed only once the row exists, so no crash leaves a volume claimed by a
        sandbox nobody knows). ``start``: how its container starts (a boot by default; a
        fork restores a snapshot)."""
        sbdir = self.sandbox_dir(row.id)
        # Made under a name of its own and locked before it gets its real one: recovery
        # (run by other processes at any time) never sees an unlocked sandbox dir that is
        # being created. The create lock is held for the whole create: an unlocked
        # "creating" row is a crash.
        new = sbdir.with_name(f"{NEW_PREFIX}{row.id}-{os.getpid()}")
        new.mkdir(mode=0o700)
        self.mode.private_dir(new)
        create_lock = open(new / CREATE_LOCK, "w")  # noqa: SIM115
        fcntl.flock(create_lock, fcntl.LOCK_EX)
        os.rename(new, sbdir)
        self.store.insert_sandbox(row)
        if not new_volume:
            try:
                self.claim_volume(row.volume_id, row.id)
            except BaseException:
                self.store.delete_sandbox(row.id)
                self.mode.remove_tree(sbdir)
                create_lock.close()
                raise
        try:
            if new_volume:
                disk_mb = row.limits["disk_mb"]
                self.mode.new_volume(row.volume_id, disk_mb)
                self.store.upsert_volume(VolumeRow(row.volume_id, disk_mb, row.created_at,
                                                   row.id))
            (start or self.booter.boot)(row)
            self.store.update_sandbox(row.id, state=final_state, last_used=time.time())
        except BaseException:
            self.destroy(row, delete_volume=new_volume)
            raise
        finally:
            create_lock.close()

    def finish_abandoned(self, row: SandboxRecord) -> bool:
        """Finish a create or kill whose process gave up or died (its lock is free):
        torn down, as recover() does. Whether ``row`` was such a one."""
        folder = self.sandbox_dir(row.id)
        if row.state == SandboxState.CREATING and not held_elsewhere(folder / CREATE_LOCK):
            self.destroy(row, delete_volume=row.volume_id == f"vol-{row.id[4:]}")
        elif row.state in (SandboxState.KILLING, SandboxState.KILLING_VOLUME) and \
                not held_elsewhere(folder / LOCK_FILE):
            self.destroy(row, delete_volume=row.state == SandboxState.KILLING_VOLUME)
        else:
            return False
        return True

    def destroy(self, row: SandboxRecord, *, delete_volume: bool) -> None:
        """Tear everything down; each step tolerates what is already gone."""
        self.runc.delete(row.id)
        self.booter.stop_network(row.id)
        volume = self.store.get_volume(row.volume_id)
        self.mode.teardown(row, keep_volume=not delete_volume)
        if delete_volume:
            self.mode.remove_volume(row.volume_id)
            if volume is not None and volume.attached_to == row.id:
                self.store.delete_volume(row.volume_id)
        elif volume is not None and volume.attached_to == row.id:  # never another's
            self.store.upsert_volume(VolumeRow(volume.id, volume.size_mb,
                                               volume.created_at, ""))
        self.mode.remove_tree(self.sandbox_dir(row.id))
        self.store.delete_sandbox(row.id)

    # states -----------------------------------------------------------------------------
    def pause(self, sandbox_id: str) -> None:
        with self.lock(sandbox_id):
            row = self.row(sandbox_id)
            if row.state == SandboxState.PAUSED:
                return
            self.ensure_container(row)
            # The row first: a crash before the freeze leaves "paused" over a running
            # container, which the next use sorts out; the other order left "running"
            # over a frozen guest, and every call waited on it.
            self.store.update_sandbox(sandbox_id, state=SandboxState.PAUSED)
            # A checkpoint needs room for its image (at most the memory); a host disk too
            # full for it pauses in memory, as without CRIU, rather than refusing.
            if self.keeps_memory() and has_room(self.sandbox_dir(sandbox_id),
                                                self.layout.config.host_reserve_mb,
                                                self.image_mb(row)):
                self.checkpoint_paused(row)
                return
            try:
                self.mode.freeze(self.runc, sandbox_id, self.control(sandbox_id))
            except BaseException:
                self.store.update_sandbox(sandbox_id, state=SandboxState.RUNNING)
                raise

    # memory checkpoints --------------------------------------------------------------
    def keeps_memory(self) -> bool:
        """Pause checkpoints to disk (CRIU works here, as root), else it freezes."""
        return self.mode.name == "root" and criu.find().ok

    @staticmethod
    def image_mb(row: SandboxRecord) -> int:
        """The most a checkpoint image of it takes: its memory."""
        return int(row.limits.get("memory_mb") or 0)

    def image_dir(self, sandbox_id: str) -> Path:
        """A paused sandbox's checkpoint (host-only, in its host directory)."""
        return self.sandbox_dir(sandbox_id) / IMAGE

    def checkpoint_paused(self, row: SandboxRecord) -> None:
        """Checkpoint the (paused-on-record) sandbox to disk and stop its container. A
        refused checkpoint restarts it instead (its guest parked: unreachable), running."""
        for done in self.sandbox_dir(row.id).glob(f"{IMAGE}{_DONE}*"):
            self.mode.remove_tree(done)
        new = checkpoint.fresh_image_dir(self.sandbox_dir(row.id) / f"{IMAGE}.new")
        self.dump(row, new, "paused keeping its memory")
        self.mode.remove_tree(self.image_dir(row.id))
        os.rename(new, self.image_dir(row.id))
        self.dumped(row.id)

    def dump(self, row: SandboxRecord, image: Path, what: str) -> None:
        """Checkpoint the running container into ``image``, stopping it. A refused
        checkpoint (its guest parked: unreachable) restarts the sandbox: running, its
        files kept, its processes ended; the error says so."""
        # The image is at most its memory: never written into the host's reserve.
        check_free(image, self.layout.config.host_reserve_mb, self.image_mb(row),
                   "a memory checkpoint")
        self.hooks.guest_gone(row.id)  # the host's kernel channels close with the guest's
        # Until dumped(): a crash from here may leave a parked guest (recovery sorts it).
        (self.sandbox_dir(row.id) / DUMPING).touch(mode=0o600)
        try:
            checkpoint.dump(self.runc, row.id, self.sandbox_dir(row.id), self.socket(row.id),
                            image, [layer["target"] for layer in row.layers])
        except BaseException as exc:
            self.mode.remove_tree(image)
            self.runc.delete(row.id)
            self.booter.stop_network(row.id)
            self.mode.unmount_root(row)
            self.dumped(row.id)
            self.booter.boot(row)
            self.store.update_sandbox(row.id, state=SandboxState.RUNNING,
                                      last_used=time.time())
            if not isinstance(exc, SandboxError):
                raise
            raise CheckpointError(
                f"sandbox {row.id} could not be {what} ({exc}); it was restarted and runs "
                "(its files kept, its processes ended)") from None
        self.booter.stop_network(row.id)

    def dumped(self, sandbox_id: str) -> None:
        """A checkpoint's outcome is on disk (an image in place, or the sandbox restarted)."""
        (self.sandbox_dir(sandbox_id) / DUMPING).unlink(missing_ok=True)

    def restore_paused(self, row: SandboxRecord) -> None:
        """Start a checkpointed sandbox's container from its image (then dropped). A
        refused restore leaves it cleanly paused, its image kept."""
        image = self.image_dir(row.id)
        try:
            self.booter.restore(row, image, fresh_bundle=False)
        except BaseException as exc:
            self.runc.delete(row.id)
            self.booter.stop_network(row.id)
            if not isinstance(exc, SandboxError):
                raise
            raise CheckpointError(
                f"sandbox {row.id} could not be resumed from its memory checkpoint "
                f"({exc}); it stays paused with its checkpoint kept (kill it, or "
                "reset_rootfs to start it afresh without its processes)") from None
        # Dropped off the resume's path (a 100 MB image takes ~15 ms to delete): out of
        # the way at once; one a crash leaves is removed by the next pause, or the kill.
        done = image.with_name(f"{IMAGE}{_DONE}{os.urandom(4).hex()}")
        os.rename(image, done)
        threading.Thread(target=self.mode.remove_tree, args=(done,),
                         name=f"drop-{row.id}").start()

    def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Store the policy and, if the container runs (or is frozen), apply it now;
        a stopped container gets it when it next boots."""
        with self.lock(sandbox_id):
            old = self.row(sandbox_id).network
            self.store.update_sandbox(sandbox_id, network=policy)
            state = self.runc.state(sandbox_id)
            if not state or state["status"] not in ("running", "paused"):
                return
            try:
                self.booter.start_network(self.row(sandbox_id))
            except BaseException:
                # The old policy back (and, if it can be, its network): never a sandbox
                # whose stored policy is not the one it has.
                self.store.update_sandbox(sandbox_id, network=old)
                with contextlib.suppress(SandboxError):
                    self.booter.start_network(self.row(sandbox_id))
                raise

    def reset_rootfs(self, sandbox_id: str) -> None:
        """Wipe the system layer (every change outside /workspace); same id, same volume."""
        with self.lock(sandbox_id):
            row = self.row(sandbox_id)
            self.hooks.guest_gone(sandbox_id)  # kernels end with the container
            self.runc.delete(sandbox_id)
            self.mode.remove_tree(self.image_dir(sandbox_id))  # its processes are not kept
            self.mode.unmount_root(row)
            self.mode.sweep_trash(self.mode.attach(row))
            self.mode.wipe_system_layer(self.booter.system_dir(row))
            # A fork's system layer is its template's again, without its snapshot's.
            row.layers = [{k: v for k, v in layer.items() if k != SHARED}
                          for layer in row.layers]
            self.store.update_sandbox(sandbox_id, layers=row.layers)
            self.booter.boot(row)
            self.store.update_sandbox(sandbox_id, state=SandboxState.RUNNING, last_used=time.time())

    def kill(self, sandbox_id: str, delete_volume: bool) -> None:
        with self.lock(sandbox_id):
            row = self.row(sandbox_id)
            # Hidden from now on, and the answer about its volume is on record: a crash
            # from here is finished by recover() the same way (the lock tells it we died).
            intent = SandboxState.KILLING_VOLUME if delete_volume else SandboxState.KILLING
            self.store.update_sandbox(sandbox_id, state=intent)
            self.hooks.guest_gone(sandbox_id, keep_contexts=False)
            self.destroy(row, delete_volume=delete_volume)
        with self._locks_guard:
            self._locks.pop(sandbox_id, None)

    def release(self, sandbox_id: str) -> None:
        """A paused sandbox's container stopped: memory released, disk kept; its next
        use boots it again, without the processes it had."""
        with self.lock(sandbox_id):
            state = self.runc.state(sandbox_id)
            # Rootless containers stay "running" for runc (stopped processes).
            if state and state["status"] in ("paused", "running"):
                self.runc.delete(sandbox_id)
                self.booter.stop_network(sandbox_id)

    def ensure_container(self, row: SandboxRecord) -> str:
        """The container's runc status, rebooting it if it is gone (host reboot, crash)."""
        state = self.runc.state(row.id)
        status = state["status"] if state else "missing"
        if status in VISIBLE:
            return status
        with self.lock(row.id):
            state = self.runc.state(row.id)
            if state and state["status"] in VISIBLE:
                return state["status"]
            if state:  # stopped, or half made: none at all needs no delete (a runc call)
                self.runc.delete(row.id)
            if (self.image_dir(row.id) / checkpoint.LISTENER).exists():
                self.restore_paused(row)
            else:
                self.mode.unmount_root(row)
                self.booter.boot(row)
            self.store.update_sandbox(row.id, state=SandboxState.RUNNING)
            return SandboxState.RUNNING

    # the guest --------------------------------------------------------------------------
    def control(self, sandbox_id: str) -> GuestClient:
        """For calls made under the sandbox's lock: a guest that stalls must not hold the
        lock (and the reaper) for long."""
        return GuestClient(self.socket(sandbox_id), io_timeout=_CONTROL_TIMEOUT)

    def guest(self, sandbox_id: str, row: SandboxRecord | None = None) -> GuestClient:
        """A client for a running sandbox: resumes a paused one, extends its life."""
        row = row or self.row(sandbox_id)
        if row.state == SandboxState.PAUSED or not os.path.exists(self.socket(sandbox_id)):
            with self.lock(sandbox_id):
                row = self.row(sandbox_id)
                status = self.ensure_container(row)
                self.mode.thaw(self.runc, row, status, self.control(sandbox_id))
                self.store.update_sandbox(sandbox_id, state=SandboxState.RUNNING,
                                          last_used=time.time())
            supervisor.ensure_running(self.layout.config)
        elif time.time() - row.last_used > _TOUCH_EVERY:
            self.store.touch(sandbox_id)
        return GuestClient(self.socket(sandbox_id))

    # volumes ----------------------------------------------------------------------------
    def claim_volume(self, volume: Any, sandbox_id: str) -> None:
        found = self.store.get_volume(volume) if isinstance(volume, str) else None
        if found is None:
            raise NotFoundError(f"volume {volume!r} not found")
        if not self.store.claim_volume(volume, sandbox_id):
            raise WrongStateError(f"volume {volume!r} is attached to sandbox "
                                  f"{found.attached_to}")

    def list_volumes(self) -> list[VolumeInfo]:
        """The volumes callers own: not those of warm pooled sandboxes or of creates in
        progress (nobody's yet)."""
        unclaimed = {r.id for r in self.store.list_sandboxes()
                     if r.state in (SandboxState.POOLED, SandboxState.CREATING)}
        return [VolumeInfo(volume_id=v.id, size_mb=v.size_mb, created_at=v.created_at,
                           attached_to=v.attached_to) for v in self.store.list_volumes()
                if v.attached_to not in unclaimed]

    def delete_volume(self, volume_id: str) -> None:
        found = self.store.get_volume(volume_id) if isinstance(volume_id, str) else None
        if found is None:
            raise NotFoundError(f"volume {volume_id!r} not found")
        if found.attached_to:
            # A claim by a sandbox that is gone, or whose kill or create was abandoned
            # (its process failed or died), holds nothing: settled here, not refused.
            owner = self.store.get_sandbox(found.attached_to)
            if owner is None:
                self.store.release_volume(volume_id, found.attached_to)
            elif owner.state not in VISIBLE:
                self.finish_abandoned(owner)
            found = self.store.get_volume(volume_id)
            if found is None:  # the finished kill deleted it
                return
            if found.attached_to:
                raise WrongStateError(f"volume {volume_id} is attached to sandbox "
                                      f"{found.attached_to}: kill that sandbox first "
                                      "(keeping the volume), then delete the volume")
        self.mode.remove_volume(volume_id)
        self.store.delete_volume(volume_id)
