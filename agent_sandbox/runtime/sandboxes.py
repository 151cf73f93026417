"""Sandbox lifecycle on one host: make, pause, resume, reset, kill, and the guest client
every call goes through. State lives in SQLite and the sandbox directories; each step
writes its intent first, so a crash at any point is finished by ``recovery``. Every step
holds the sandbox's lock (this process's threads and other processes alike)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent_sandbox.errors import NotFoundError, SandboxError, WrongStateError
from agent_sandbox.models import SandboxInfo, VolumeInfo
from agent_sandbox.netpolicy import NetworkPolicy
from agent_sandbox.runtime import supervisor, validate
from agent_sandbox.runtime.activity import Activity, streamed
from agent_sandbox.runtime.boot import Booter
from agent_sandbox.runtime.guest_client import (
    GuestClient,
    GuestProtocolError,
    GuestUnavailableError,
)
from agent_sandbox.runtime.host_mode import HostMode
from agent_sandbox.runtime.kernels import Kernels
from agent_sandbox.runtime.netproxy.config import PROXY_ENV
from agent_sandbox.runtime.oci import DEFAULT_PATH
from agent_sandbox.runtime.runc import Runc
from agent_sandbox.runtime.sandbox_lock import SandboxLock
from agent_sandbox.runtime.store import SandboxRow, SandboxState, Store, VolumeRow
from agent_sandbox.runtime.templates import Template, TemplateStore

_CONTROL_TIMEOUT = 10.0  # freeze/thaw answers, under the sandbox's lock
# last_used is written at most this often per sandbox: idle timeouts are seconds long,
# and a write per exec is a measurable share of a 5 ms round trip.
_TOUCH_EVERY = 1.0
VISIBLE = (SandboxState.RUNNING, SandboxState.PAUSED)
NEW_PREFIX = ".new-"  # a sandbox dir being made, before its create lock is held
TEMPLATE_REUSE = 2.0  # seconds a template's metadata serves calls to live sandboxes


class Sandboxes:
    def __init__(self, mode: HostMode, runc: Runc, store: Store, templates: TemplateStore,
                 activity: Activity, enforced: dict[str, bool]) -> None:
        self.mode = mode
        self.layout = mode.layout
        self.runc = runc
        self.store = store
        self.templates = templates
        self.activity = activity
        self.enforced = enforced
        self.booter = Booter(mode, runc, store)
        self.code = Kernels(self)
        self._locks: dict[str, SandboxLock] = {}
        self._locks_guard = threading.Lock()
        self._templates_seen: dict[str, tuple[float, Template]] = {}

    # what kernels and the facade read ---------------------------------------------------
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

    def row(self, sandbox_id: str) -> SandboxRow:
        validate.sandbox_id(sandbox_id)
        row = self.store.get_sandbox(sandbox_id)
        if row is None or row.state not in VISIBLE:
            raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)")
        return row

    def info(self, row: SandboxRow) -> SandboxInfo:
        return SandboxInfo(
            sandbox_id=row.id, template=row.template, state=row.state,
            created_at=row.created_at, last_used=row.last_used, timeout=row.timeout,
            persistent=row.persistent, network=row.network, volume_id=row.volume_id,
            metadata=row.metadata, envs=row.envs, limits=row.limits,
            enforced=self.enforced, owner=row.owner,
        )

    def template_for(self, row: SandboxRow) -> Template:
        """The template's metadata (workdir, env, commands) for a call to a live sandbox.
        A shared template's trust checks cost ~50 us and every call asked for it twice:
        an answer is reused for ``TEMPLATE_REUSE`` seconds (creates always check afresh)."""
        seen = self._templates_seen.get(row.template)
        if seen is not None and seen[0] > time.monotonic():
            return seen[1]
        try:
            tmpl = self.templates.get(row.template)
            self._templates_seen[row.template] = (time.monotonic() + TEMPLATE_REUSE, tmpl)
            return tmpl
        except NotFoundError:
            # The template was removed after the sandbox was made: its layers are frozen
            # in the row; the guest interpreter falls back to the default.
            return Template(name=row.template, kind="gone", layers=[])

    def env(self, row: SandboxRow, extra: dict[str, str] | None) -> dict[str, str]:
        tmpl = self.template_for(row)
        env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm",
               "SANDBOX_ID": row.id}
        if row.network.mode != "off":
            env.update(PROXY_ENV)
        env.update(tmpl.env)
        env.update(row.envs)
        env.update(validate.envs(extra))
        return env

    # make and destroy -------------------------------------------------------------------
    def make(self, row: SandboxRow, *, new_volume: bool, final_state: str) -> None:
        """Create the sandbox of ``row``: on a new volume, or on the kept one it names
        (claimed only once the row exists, so no crash leaves a volume claimed by a
        sandbox nobody knows)."""
        sbdir = self.sandbox_dir(row.id)
        # Made under a name of its own and locked before it gets its real one: recovery
        # (run by other processes at any time) never sees an unlocked sandbox dir that is
        # being created. The create lock is held for the whole create: an unlocked
        # "creating" row is a crash.
        new = sbdir.with_name(f"{NEW_PREFIX}{row.id}-{os.getpid()}")
        new.mkdir(mode=0o700)
        self.mode.private_dir(new)
        create_lock = open(new / "create.lock", "w")  # noqa: SIM115
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
            self.booter.boot(row)
            self.store.update_sandbox(row.id, state=final_state, last_used=time.time())
        except BaseException:
            self.destroy(row, delete_volume=new_volume)
            raise
        finally:
            create_lock.close()

    def destroy(self, row: SandboxRow, *, delete_volume: bool) -> None:
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
            try:
                self.mode.freeze(self.runc, sandbox_id, self.control(sandbox_id))
            except BaseException:
                self.store.update_sandbox(sandbox_id, state=SandboxState.RUNNING)
                raise

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
            self.code.forget(sandbox_id)  # kernels end with the container
            self.runc.delete(sandbox_id)
            self.mode.unmount_root(row)
            self.mode.sweep_trash(self.mode.attach(row))
            self.mode.wipe_system_layer(self.booter.system_dir(row))
            self.booter.boot(row)
            self.store.update_sandbox(sandbox_id, state=SandboxState.RUNNING, last_used=time.time())

    def kill(self, sandbox_id: str, delete_volume: bool) -> None:
        with self.lock(sandbox_id):
            row = self.row(sandbox_id)
            # Hidden from now on, and the answer about its volume is on record: a crash
            # from here is finished by recover() the same way (the lock tells it we died).
            intent = SandboxState.KILLING_VOLUME if delete_volume else SandboxState.KILLING
            self.store.update_sandbox(sandbox_id, state=intent)
            self.code.forget(sandbox_id, keep_contexts=False)
            self.destroy(row, delete_volume=delete_volume)
        with self._locks_guard:
            self._locks.pop(sandbox_id, None)

    def ensure_container(self, row: SandboxRow) -> str:
        """The container's runc status, rebooting it if it is gone (host reboot, crash)."""
        state = self.runc.state(row.id)
        status = state["status"] if state else "missing"
        if status in VISIBLE:
            return status
        with self.lock(row.id):
            state = self.runc.state(row.id)
            if state and state["status"] in VISIBLE:
                return state["status"]
            self.runc.delete(row.id)
            self.mode.unmount_root(row)
            self.booter.boot(row)
            self.store.update_sandbox(row.id, state=SandboxState.RUNNING)
            return SandboxState.RUNNING

    # the guest --------------------------------------------------------------------------
    def control(self, sandbox_id: str) -> GuestClient:
        """For calls made under the sandbox's lock: a guest that stalls must not hold the
        lock (and the reaper) for long."""
        return GuestClient(self.socket(sandbox_id), io_timeout=_CONTROL_TIMEOUT)

    def guest(self, sandbox_id: str, row: SandboxRow | None = None) -> GuestClient:
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

    def call(self, sandbox_id: str, fn: Callable[[GuestClient], Any],
             row: SandboxRow | None = None) -> Any:
        """Run a guest operation; if the guest is gone (OOM, crash), reboot it once. A
        guest that breaks the protocol is stopped: the next call boots a genuine one."""
        client = self.guest(sandbox_id, row)
        try:
            with self.activity.busy(sandbox_id):
                try:
                    return fn(client)
                except GuestUnavailableError:
                    row = self.row(sandbox_id)
                    state = self.runc.state(sandbox_id)
                    if state and state["status"] in VISIBLE:
                        raise
                    self.ensure_container(row)
                    return fn(GuestClient(self.socket(sandbox_id)))
        except GuestProtocolError as exc:
            with self.lock(sandbox_id):
                self.code.forget(sandbox_id)
                self.runc.delete(sandbox_id)
            raise GuestProtocolError(f"sandbox {sandbox_id} misbehaved and was stopped ({exc}); "
                                     "its next use restarts it, without its processes") from None

    def stream(self, sandbox_id: str,
               fn: Callable[[GuestClient], Iterator[bytes]]) -> Iterator[bytes]:
        """A guest operation that answers in chunks (``activity.streamed``)."""
        return streamed(self.activity, sandbox_id, self.call(sandbox_id, fn))

    # volumes ----------------------------------------------------------------------------
    def claim_volume(self, volume: Any, sandbox_id: str) -> None:
        found = self.store.get_volume(volume) if isinstance(volume, str) else None
        if found is None:
            raise NotFoundError(f"volume {volume!r} not found")
        if not self.store.claim_volume(volume, sandbox_id):
            raise WrongStateError(f"volume {volume!r} is attached to sandbox "
                                  f"{found.attached_to}")

    def list_volumes(self) -> list[VolumeInfo]:
        return [VolumeInfo(volume_id=v.id, size_mb=v.size_mb, created_at=v.created_at,
                           attached_to=v.attached_to) for v in self.store.list_volumes()]

    def delete_volume(self, volume_id: str) -> None:
        found = self.store.get_volume(volume_id) if isinstance(volume_id, str) else None
        if found is None:
            raise NotFoundError(f"volume {volume_id!r} not found")
        if found.attached_to:
            raise WrongStateError(f"volume {volume_id} is attached to {found.attached_to}")
        self.mode.remove_volume(volume_id)
        self.store.delete_volume(volume_id)
