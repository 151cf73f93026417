"""Sandboxes as runc containers on this host: the embedded engine's backend.

Every sandbox is a detached runc container whose PID 1 is our guest agent. State lives in
SQLite and the sandbox directories, so any number of processes (an MCP server, the CLI, a
gateway) can share one data dir, and a new process after a crash or ``kill -9`` finds
every sandbox again. The parts: ``host/`` (root, or as an ordinary user), ``sandboxes``
(lifecycle), ``boot`` (containers), ``pool``, ``recovery``. Constructing one does no I/O;
``open()`` (or the first call) does.
"""

from __future__ import annotations

import contextlib
import json
import os
import py_compile
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.runc import recovery, supervisor, usage
from agent_sandbox.backends.runc.host.guest_python import HOST_USR
from agent_sandbox.backends.runc.host.mode import HostMode
from agent_sandbox.backends.runc.host.select import select_host_mode
from agent_sandbox.backends.runc.kernel_files import RunDirKernelFiles
from agent_sandbox.backends.runc.netproxy.config import PROXY_ENV
from agent_sandbox.backends.runc.pool import WarmPool
from agent_sandbox.backends.runc.rootfs.confined import open_dir, openat2
from agent_sandbox.backends.runc.rootfs.overlay import mounts_under
from agent_sandbox.backends.runc.runc import Runc
from agent_sandbox.backends.runc.sandboxes import Sandboxes
from agent_sandbox.backends.runc.snapshots import RuncSnapshots
from agent_sandbox.backends.runc.store import Store
from agent_sandbox.backends.runc.templates import code_interpreter
from agent_sandbox.backends.runc.templates.recipe_layers import RecipeLayers
from agent_sandbox.backends.runc.templates.shared import SharedTemplates
from agent_sandbox.backends.runc.templates.store import TemplateStore
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    RuntimeUnavailableError,
    WrongStateError,
)
from agent_sandbox.core.metrics import Usage
from agent_sandbox.core.models import SnapshotInfo, TemplateInfo, VolumeInfo
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import VISIBLE, SandboxState
from agent_sandbox.core.templates import Template
from agent_sandbox.guest import SOURCE_DIR as GUEST_SOURCE
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.service.backend import ServiceHooks
from agent_sandbox.service.code.files import KernelFiles
from agent_sandbox.service.record import SandboxRecord, claimed_fields

if TYPE_CHECKING:
    from agent_sandbox.service.code.files import KernelHost

# At exit, how long closing waits for another process's hold on the template views.
CLOSE_WAIT = 2.0
_BASE_REFRESH_EVERY = 10.0  # seconds: new sandboxes see the host's new /etc


class RuncBackend:
    name = "runc"
    injects_secrets = True  # its network proxy swaps placeholders (service/secrets.py)

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.mode: HostMode = select_host_mode(self.config)
        self.hooks: ServiceHooks | None = None
        self._start_guard = threading.Lock()
        self._stop = threading.Event()
        self._parts: Sandboxes | None = None
        self._reaping: int | None = None
        self._pool: WarmPool | None = None
        self._base_refreshed = time.monotonic()

    # start and stop ---------------------------------------------------------------------
    def bind(self, hooks: ServiceHooks) -> None:
        self.hooks = hooks

    def open(self) -> RuncBackend:
        """Make the data dir, open the state, finish what crashed processes left, start
        the warm pool. Idempotent; the first call of any method opens it."""
        with self._start_guard:
            if self._parts is not None:
                return self
            if self.hooks is None:
                raise RuntimeError("a backend is opened by its service (bind first)")
            self.mode.prepare()
            runc = Runc(self.config.runc_root, systemd_cgroup=self.mode.cgroups == "systemd")
            _precompile_guest()
            store = Store(self.config.db_path)
            shared = SharedTemplates(self.config.shared_templates_dir,
                                     mirror_dirs=self.mode.name == "rootless")
            templates = TemplateStore(self.config.templates_dir, self.mode.assemble_base,
                                      shared)
            parts = Sandboxes(self.mode, runc, store, templates, self.hooks,
                              self.mode.enforced_limits())
            recovery.recover(parts)
            self._pool = WarmPool(parts, self.config, self._stop)
            self._parts = parts
        if self.config.pool_size > 0:
            self._pool.wake.set()
            threading.Thread(target=self._pool.run, name="abx-pool", daemon=True).start()
        return self

    @property
    def parts(self) -> Sandboxes:
        return self._parts if self._parts is not None else self.open().parts

    def reaping(self) -> bool:
        """This process keeps the idle timeouts; meanwhile the data dir's supervisor
        stands down."""
        self.parts  # noqa: B018 - opened
        if self._reaping is None:
            self._reaping = supervisor.hold_reaper_lock(self.config.data_dir)
        return True

    def maintain(self) -> None:
        if time.monotonic() - self._base_refreshed > _BASE_REFRESH_EVERY:
            self._base_refreshed = time.monotonic()
            self.parts.templates.refresh_base()

    def close(self) -> None:
        self._stop.set()
        if self._reaping is not None:
            os.close(self._reaping)
            self._reaping = None
        if self._parts is None:
            return
        if self._pool is not None:
            self._pool.wake.set()
        # The last process out leaves no host mounts behind when no sandbox exists; but
        # never waits long for another process's hold on the views (this runs at exit:
        # Ctrl-C on `abx sandbox port` waited as long as that process held them). The
        # holder is using them, or releasing them itself; the next exit releases them.
        try:
            self.release_host_mounts(wait=CLOSE_WAIT)
        except Exception:  # noqa: BLE001 - closing must not fail
            pass

    @property
    def store(self) -> Store:
        return self.parts.store

    @property
    def runc(self) -> Runc:
        return self.parts.runc

    @property
    def templates(self) -> TemplateStore:
        return self.parts.templates

    @property
    def enforced(self) -> dict[str, bool]:
        return self.parts.enforced

    @property
    def sandbox_owner(self) -> int | None:
        return self.mode.sandbox_owner

    def describe(self) -> dict[str, Any]:
        """Which engine runs here and what it really enforces (``abx doctor`` shows it)."""
        return self.mode.describe(self.parts.enforced)

    def disk_headroom(self) -> dict[str, int]:
        """Free bytes on the data dir's filesystem and the reserve creates keep."""
        return {"free_bytes": shutil.disk_usage(self.config.data_dir).free,
                "reserve_bytes": self.config.host_reserve_mb << 20}

    def usage(self, sandbox_id: str) -> Usage:
        """From the container's cgroup (cgroupfs: ``/abx/<id>``, as the bundle names it;
        otherwise the cgroup its init process is in) and the filesystem of its disk."""
        parts = self.parts
        row = parts.row(sandbox_id)
        if self.mode.cgroups == "cgroupfs":
            cgroup: str | None = f"/abx/{sandbox_id}"
        else:
            state = parts.runc.state(sandbox_id) or {}
            pid = state.get("pid")
            cgroup = usage.cgroup_of_pid(pid) if isinstance(pid, int) and pid > 0 else None
        if cgroup is None:
            raise RuntimeUnavailableError(f"sandbox {sandbox_id} has no cgroup to read "
                                          "metrics from (is it running?)")
        return usage.read(cgroup, row.limits.get("cpu"), self.mode.disk_root(row))

    def release_host_mounts(self, wait: float | None = None) -> None:
        """Unmount the template views once no sandbox exists (before deleting the data
        dir: the views are read-only, but a recursive delete must not walk into them).
        ``wait``: at most this long for another process using them (TimeoutError)."""
        store = self.parts.store
        if not self.mode.release_views(lambda: bool(store.list_sandboxes()), wait):
            raise WrongStateError("sandboxes still exist; kill them first")

    def release_host(self) -> None:
        self.release_host_mounts()
        supervisor.stop(self.config.data_dir)  # nothing left for it to look after

    def leftovers(self) -> list[str]:
        return mounts_under(self.config.data_dir)

    def recover(self) -> None:
        """Clean up after crashes: half-made sandboxes, orphan containers, mounts, dirs."""
        recovery.recover(self.parts)
        self._snapshots.collect()  # deleted snapshots whose last fork a crash ended

    # records ------------------------------------------------------------------------------
    def record(self, sandbox_id: str) -> SandboxRecord:
        return self.parts.row(sandbox_id)

    def records(self) -> list[SandboxRecord]:
        return self.parts.store.list_sandboxes()

    def update(self, sandbox_id: str, **fields: Any) -> None:
        self.parts.store.update_sandbox(sandbox_id, **fields)

    def touch(self, sandbox_id: str) -> None:
        self.parts.store.touch(sandbox_id)

    # templates --------------------------------------------------------------------------
    def template(self, name: str, *, creating: bool = False) -> Template:
        if creating and name == code_interpreter.NAME:  # built on first use, once per host
            return code_interpreter.ensure(self.parts.templates,
                                           index_url=self.config.template_index_url)
        return self.parts.templates.get(name)

    def list_templates(self) -> list[TemplateInfo]:
        return [_template_info(t) for t in self.parts.templates.list()]

    def build_template(self, name: str, *, index_url: str | None, force: bool,
                       progress: Callable[[str], None] | None) -> tuple[TemplateInfo, str]:
        if name != code_interpreter.NAME:
            raise InvalidArgumentError(
                f"only {code_interpreter.NAME} is built from a recipe here; other templates "
                "come from a root filesystem directory or an image archive")
        url = self.config.template_index_url if index_url is None else index_url
        tmpl = code_interpreter.ensure(self.parts.templates, index_url=url, progress=progress,
                                       force=force)
        return _template_info(tmpl), code_interpreter.describe_location(self.parts.templates,
                                                                        tmpl)

    # recipes ----------------------------------------------------------------------------
    def recipes(self) -> RecipeLayers:
        if self.mode.name == "rootless":
            raise WrongStateError("recipe builds need the root engine for now (a rootless "
                                  "engine cannot read its sandboxes' layers as their owner); "
                                  "build as root, or through the daemon or a gateway")
        return RecipeLayers(self.parts.templates,
                            max_layer_bytes=self.config.build_max_layer_mb << 20,
                            max_context_bytes=self.config.build_max_layer_mb << 20)

    def template_exists(self, name: str) -> bool:
        return self.parts.templates.exists(name)

    def template_info(self, tmpl: Template) -> TemplateInfo:
        return _template_info(tmpl)

    def capture_layer(self, sandbox_id: str, key: str) -> None:
        """A build step's layer: the sandbox frozen, each overlay upper dir read out of it
        confined (``layer_diff``)."""
        parts = self.parts
        row = parts.row(sandbox_id)
        parts.pause(sandbox_id)  # nothing in it runs while its layer is read
        system = open_dir(parts.booter.system_dir(row))
        uppers: list[tuple[str, int]] = []
        try:
            for index, layer in enumerate(row.layers):
                try:
                    fd = openat2(system, f"upper/{index}", os.O_RDONLY | os.O_DIRECTORY)
                except FileNotFoundError:
                    continue
                uppers.append((layer["target"], fd))
            config = json.loads((parts.sandbox_dir(sandbox_id) / "config.json").read_text())
            mounts = [m["destination"] for m in config.get("mounts", [])
                      if m.get("type") != "overlay"] + [HOST_USR.rsplit("/", 1)[0]]
            self.recipes().capture(key, uppers, mounts)
        finally:
            for _target, fd in uppers:
                os.close(fd)
            os.close(system)

    def prune_layers(self) -> tuple[int, int]:
        running = {lower for r in self.parts.store.list_sandboxes() for layer in r.layers
                   for lower in layer["lowers"]}
        return self.recipes().prune(self.mode.forget_views, running)

    def _refuse_if_used(self, name: str) -> None:
        in_use = [r.id for r in self.parts.store.list_sandboxes() if r.template == name]
        if in_use:
            raise WrongStateError(f"template {name!r} is used by sandboxes "
                                  f"{', '.join(in_use)}; kill them first")

    def remove_template(self, name: str) -> None:
        self._refuse_if_used(name)
        templates = self.parts.templates
        # Its own directories (not base's), here or in the shared directory.
        own = (str(templates.path(name)) + "/",
               f"{self.config.shared_templates_dir}/{name}/")
        lowers = [lower for layer in templates.get(name).layers
                  for lower in layer.lowers if lower.startswith(own)]
        templates.remove(name)
        self.mode.forget_views(lowers)

    def import_template(self, name: str, source: str, *, replace: bool = False,
                        **kw: Any) -> TemplateInfo:
        """Import a directory or an OCI/docker image archive as a template.

        ``kw``: env, workdir, commands, description, ref (archives), progress.
        """
        templates = self.parts.templates
        if replace and templates.exists(name):
            self._refuse_if_used(name)  # replacing deletes the rootfs they run on
        return _template_info(templates.import_path(name, source, replace=replace, **kw))

    # creates ----------------------------------------------------------------------------
    def limit_caps(self) -> dict[str, tuple[float, str]]:
        return {"cpu": (os.cpu_count() or 1, "this host's CPUs"),
                "memory_mb": (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20,
                              "this host's memory, in MiB")}

    def check_network(self, policy: NetworkPolicy) -> None:
        self.mode.check_network()

    @contextlib.contextmanager
    def creating(self) -> Iterator[None]:
        self.parts  # noqa: B018 - opened
        assert self._pool is not None
        with self._pool.first_served():  # the warm pool's own boots wait for this one
            yield

    def claim_pooled(self, record: SandboxRecord) -> str | None:
        self.parts  # noqa: B018 - opened
        assert self._pool is not None
        return self._pool.claim(record.template, **claimed_fields(record))

    def make(self, record: SandboxRecord, template: Template, *, new_volume: bool) -> None:
        self.parts.make(record, new_volume=new_volume, final_state=SandboxState.RUNNING)

    def drain_pool(self) -> int:
        self.parts  # noqa: B018 - opened
        assert self._pool is not None
        return self._pool.drain()

    # lifecycle ----------------------------------------------------------------------------
    def pause(self, sandbox_id: str) -> None:
        self.parts.pause(sandbox_id)

    def resume(self, sandbox_id: str) -> None:
        self.parts.guest(sandbox_id)

    def release(self, sandbox_id: str) -> None:
        self.parts.release(sandbox_id)

    def reset_rootfs(self, sandbox_id: str) -> None:
        self.parts.reset_rootfs(sandbox_id)

    def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        self.parts.set_network(sandbox_id, policy)

    def kill(self, sandbox_id: str, *, delete_volume: bool) -> None:
        self.parts.kill(sandbox_id, delete_volume)
        self._snapshots.collect()  # a deleted snapshot it was the last to read

    # the guest ----------------------------------------------------------------------------
    def guest(self, sandbox_id: str, record: SandboxRecord | None = None) -> GuestClient:
        return self.parts.guest(sandbox_id, record)

    def client(self, sandbox_id: str) -> GuestClient:
        return self.parts.client(sandbox_id)

    def replace_guest(self, sandbox_id: str, failed: GuestClient) -> GuestClient | None:
        """A container that is gone (OOM, a crash, a host reboot) is booted again; one
        that still runs has a busy guest, which is not replaced (it would lose it all)."""
        parts = self.parts
        row = parts.row(sandbox_id)
        if row.state == SandboxState.PAUSED:
            # Paused meanwhile: a checkpoint closes every connection to the guest. Not a
            # crash to make up for (that would resume it, and run the call again).
            return None
        state = parts.runc.state(sandbox_id)
        if state and state["status"] in VISIBLE:
            return None
        parts.ensure_container(row)
        return parts.client(sandbox_id)

    def stop_misbehaving(self, sandbox_id: str) -> None:
        parts = self.parts
        with parts.lock(sandbox_id):
            assert self.hooks is not None
            self.hooks.guest_gone(sandbox_id)
            parts.runc.delete(sandbox_id)

    def guest_env(self, record: SandboxRecord) -> dict[str, str]:
        if record.network.mode == "off":
            return {}
        material = self.parts.booter.secrets.material(record.id)
        return {**PROXY_ENV, **(material.envs() if material else {})}

    def kernel_files(self, host: KernelHost) -> KernelFiles:
        return RunDirKernelFiles(host)

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.mode.layout.sandbox_dir(sandbox_id)

    # memory snapshots -------------------------------------------------------------------
    @property
    def _snapshots(self) -> RuncSnapshots:
        return RuncSnapshots(self.parts)

    def take_snapshot(self, sandbox_id: str, snapshot_id: str, name: str,
                      owner: str) -> SnapshotInfo:
        return self._snapshots.take(sandbox_id, snapshot_id, name, owner)

    def snapshots(self) -> list[SnapshotInfo]:
        return self._snapshots.list()

    def snapshot_source(self, snapshot_id: str) -> tuple[SnapshotInfo, SandboxRecord]:
        return self._snapshots.source(snapshot_id)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._snapshots.delete(snapshot_id)

    def make_from_snapshot(self, record: SandboxRecord, snapshot_id: str) -> None:
        with self.creating():
            self._snapshots.make_from(record, snapshot_id)

    # volumes ------------------------------------------------------------------------------
    def volumes(self) -> list[VolumeInfo]:
        return self.parts.list_volumes()

    def delete_volume(self, volume_id: str) -> None:
        self.parts.delete_volume(volume_id)
        self._snapshots.collect()


def _precompile_guest() -> None:
    """Bytecode for the guest's modules: saves ~20 ms of every sandbox start. Any
    python3 of the same minor version inside a template uses it; others compile."""
    for source in GUEST_SOURCE.glob("*.py"):
        try:
            py_compile.compile(str(source), doraise=True)
        except (OSError, py_compile.PyCompileError):
            return  # read-only install: the guest still starts, a little slower


def _template_info(t: Template) -> TemplateInfo:
    own = t.build_inputs.get("recipe_own", []) if t.kind == "recipe" else []
    return TemplateInfo(name=t.name, kind=t.kind, description=t.description, env=t.env,
                        workdir=t.workdir, commands=t.commands, has_kernel=t.kernel is not None,
                        languages=sorted(t.kernels()), created_at=t.created_at,
                        parent=t.parent, layers=len(own),
                        size_bytes=int(t.build_inputs.get("recipe_bytes", 0)),
                        owner=str(t.build_inputs.get("owner", "")))
