"""The embedded engine: sandboxes on one Linux host, behind one small facade.

Every sandbox is a detached runc container whose PID 1 is our guest agent. State lives in
SQLite and the sandbox directories, so any number of engine processes (an MCP server, the
CLI) can share one data dir, and a new process after a crash or ``kill -9`` finds every
sandbox again. The parts: ``host_mode`` (root, or as an ordinary user), ``sandboxes`` (lifecycle),
``boot`` (containers), ``pool``, ``reaper``, ``recovery``, ``guest_ops`` (what runs
inside). Constructing an ``Engine`` does no I/O; ``open()`` (or the first call) does.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import threading
import time
from typing import Any

from agent_sandbox import netpolicy
from agent_sandbox.errors import InvalidArgumentError, WrongStateError
from agent_sandbox.models import SandboxInfo, TemplateInfo, VolumeInfo
from agent_sandbox.netpolicy import NetworkSpec
from agent_sandbox.runtime import code_template, recovery, supervisor, validate
from agent_sandbox.runtime.activity import Activity
from agent_sandbox.runtime.boot import GUEST_DIR
from agent_sandbox.runtime.config import EngineConfig, Limits
from agent_sandbox.runtime.guest_dirs import DirOps
from agent_sandbox.runtime.guest_ops import GuestOps
from agent_sandbox.runtime.host_mode import HostMode, select_host_mode
from agent_sandbox.runtime.pool import WarmPool, new_id
from agent_sandbox.runtime.port_forward import PortForwards
from agent_sandbox.runtime.reaper import reap_loop, reap_once
from agent_sandbox.runtime.runc import Runc
from agent_sandbox.runtime.sandboxes import VISIBLE, Sandboxes
from agent_sandbox.runtime.shared_templates import SharedTemplates
from agent_sandbox.runtime.store import SandboxRow, SandboxState, Store
from agent_sandbox.runtime.templates import Template, TemplateStore
from agent_sandbox.runtime.terminals import Terminals

# At exit, how long closing waits for another process's hold on the template views.
CLOSE_WAIT = 2.0


class Engine(GuestOps, DirOps, Terminals):
    def __init__(self, config: EngineConfig | None = None, *, reaper: bool = True) -> None:
        self.config = config or EngineConfig()
        self.mode: HostMode = select_host_mode(self.config)
        self._reaper = reaper
        self._start_guard = threading.Lock()
        self._stop = threading.Event()
        self._parts: Sandboxes | None = None
        self._reaping: int | None = None
        self._pool: WarmPool | None = None
        self._ports = PortForwards(lambda sandbox_id: self._sandboxes.guest(sandbox_id))

    # start and stop ---------------------------------------------------------------------
    def open(self) -> Engine:
        """Make the data dir, open the state, finish what crashed processes left, start
        the reaper and the warm pool. Idempotent; the first call of any method opens it."""
        with self._start_guard:
            if self._parts is not None:
                return self
            self.mode.prepare()
            runc = Runc(self.config.runc_root, systemd_cgroup=self.mode.cgroups == "systemd")
            _precompile_guest()
            store = Store(self.config.db_path)
            shared = SharedTemplates(self.config.shared_templates_dir,
                                     mirror_dirs=self.mode.name == "rootless")
            templates = TemplateStore(self.config.templates_dir, self.mode.assemble_base,
                                      shared)
            parts = Sandboxes(self.mode, runc, store, templates,
                              Activity(store.touch, self._stop), self.mode.enforced_limits())
            recovery.recover(parts)
            self._pool = WarmPool(parts, self.config, self._stop)
            self._parts = parts
        if self._reaper:
            # While this process reaps, the data dir's supervisor stands down.
            self._reaping = supervisor.hold_reaper_lock(self.config.data_dir)
            threading.Thread(target=reap_loop, args=(parts, self.config, self._stop),
                             name="abx-reaper", daemon=True).start()
        if self.config.pool_size > 0:
            self._pool.wake.set()
            threading.Thread(target=self._pool.run, name="abx-pool", daemon=True).start()
        return self

    @property
    def _sandboxes(self) -> Sandboxes:  # type: ignore[override]
        return self._parts if self._parts is not None else self.open()._sandboxes

    def close(self) -> None:
        self._stop.set()
        self._ports.close()
        if self._reaping is not None:
            os.close(self._reaping)
            self._reaping = None
        if self._parts is None:
            return
        if self._pool is not None:
            self._pool.wake.set()
        self._parts.code.close()
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
        return self._sandboxes.store

    @property
    def runc(self) -> Runc:
        return self._sandboxes.runc

    @property
    def templates(self) -> TemplateStore:
        return self._sandboxes.templates

    def engine_info(self) -> dict[str, Any]:
        """Which engine runs here and what it really enforces (``abx doctor`` shows it)."""
        return self.mode.describe(self._sandboxes.enforced)

    def disk_headroom(self) -> dict[str, int]:
        """Free bytes on the data dir's filesystem and the reserve creates keep."""
        return {"free_bytes": shutil.disk_usage(self.config.data_dir).free,
                "reserve_bytes": self.config.host_reserve_mb << 20}

    def release_host_mounts(self, wait: float | None = None) -> None:
        """Unmount the template views once no sandbox exists (before deleting the data
        dir: the views are read-only, but a recursive delete must not walk into them).
        ``wait``: at most this long for another process using them (TimeoutError)."""
        store = self._sandboxes.store
        if not self.mode.release_views(lambda: bool(store.list_sandboxes()), wait):
            raise WrongStateError("sandboxes still exist; kill them first")

    # templates --------------------------------------------------------------------------
    def list_templates(self) -> list[TemplateInfo]:
        return [_template_info(t) for t in self.templates.list()]

    def get_template(self, name: str) -> Template:
        return self.templates.get(name)

    def _refuse_if_used(self, name: str) -> None:
        in_use = [r.id for r in self.store.list_sandboxes() if r.template == name]
        if in_use:
            raise WrongStateError(f"template {name!r} is used by sandboxes "
                                  f"{', '.join(in_use)}; kill them first")

    def remove_template(self, name: str) -> None:
        self._refuse_if_used(name)
        # Its own directories (not base's), here or in the shared directory.
        own = (str(self.templates.path(name)) + "/",
               f"{self.config.shared_templates_dir}/{name}/")
        lowers = [lower for layer in self.templates.get(name).layers
                  for lower in layer.lowers if lower.startswith(own)]
        self.templates.remove(name)
        self.mode.forget_views(lowers)

    def import_template(self, name: str, source: str, *, replace: bool = False,
                        **kw: Any) -> TemplateInfo:
        """Import a directory or an OCI/docker image archive as a template.

        ``kw``: env, workdir, commands, description, ref (archives), progress.
        """
        if replace and self.templates.exists(name):
            self._refuse_if_used(name)  # replacing deletes the rootfs they run on
        return _template_info(self.templates.import_path(name, source, replace=replace, **kw))

    # lifecycle --------------------------------------------------------------------------
    def create(
        self,
        template: str = "base",
        timeout: float = 300,
        envs: dict[str, str] | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        network: NetworkSpec = False,
        persistent: bool = False,
        metadata: dict[str, str] | None = None,
        volume: str | None = None,
        owner: str = "",
    ) -> SandboxInfo:
        parts = self._sandboxes
        assert self._pool is not None
        with self._pool.first_served():  # the warm pool's own boots wait for this one
            if template == code_template.NAME:  # built on first use (a minute, once per host)
                tmpl = code_template.ensure(parts.templates,
                                            index_url=self.config.template_index_url)
            else:
                tmpl = parts.templates.get(template)
            limits = _limits(self.config.limits, cpu, memory_mb, disk_mb)
            timeout = validate.positive(timeout, "timeout", allow_none=False, maximum=30 * 86400)
            if not isinstance(persistent, bool):
                raise InvalidArgumentError("persistent must be true or false")
            network = netpolicy.parse(network)
            envs = validate.envs(envs)
            metadata = validate.metadata(metadata)
            if network.mode != "off":
                self.mode.check_network()
            if self._pool.fits(tmpl.name, volume=volume, network=network.mode != "off",
                               limits=limits.__dict__):
                claimed = self._pool.claim(tmpl.name, timeout=float(timeout), persistent=persistent,
                                           envs=envs, metadata=metadata, owner=owner)
                if claimed is not None:
                    return self.info(claimed)
            sandbox_id = new_id()
            now = time.time()
            row = SandboxRow(
                id=sandbox_id, template=tmpl.name, state=SandboxState.CREATING, created_at=now,
                last_used=now, timeout=float(timeout), persistent=persistent, network=network,
                volume_id=volume or f"vol-{sandbox_id[4:]}", envs=envs, metadata=metadata,
                limits=limits.__dict__,
                layers=[{"target": layer.target, "lowers": layer.lowers} for layer in tmpl.layers],
                owner=owner,
            )
            parts.make(row, new_volume=volume is None, final_state=SandboxState.RUNNING)
            return self.info(sandbox_id)

    def drain_pool(self) -> int:
        """Destroy every warm, unclaimed sandbox; returns how many."""
        self._sandboxes  # noqa: B018 - started
        assert self._pool is not None
        return self._pool.drain()

    def info(self, sandbox_id: str) -> SandboxInfo:
        parts = self._sandboxes
        return parts.info(parts.row(sandbox_id))

    def list(self, template: str | None = None, state: str | None = None,
             owner: str | None = None) -> list[SandboxInfo]:
        if state is not None and state not in VISIBLE:
            raise InvalidArgumentError(f"state must be 'running' or 'paused', got {state!r}")
        parts = self._sandboxes
        return [
            parts.info(r) for r in parts.store.list_sandboxes()
            if r.state in VISIBLE
            and (template is None or r.template == template)
            and (state is None or r.state == state)
            and (owner is None or r.owner == owner)
        ]

    def pause(self, sandbox_id: str) -> SandboxInfo:
        self._sandboxes.pause(sandbox_id)
        return self.info(sandbox_id)

    def resume(self, sandbox_id: str) -> SandboxInfo:
        self._sandboxes.guest(sandbox_id)
        return self.info(sandbox_id)

    def set_network(self, sandbox_id: str, network: NetworkSpec) -> None:
        """Change what a sandbox may reach, without restarting it: its rules are replaced
        and its proxy restarted, so connections open through the old one are closed."""
        policy = netpolicy.parse(network)
        if policy.mode != "off":
            self.mode.check_network()
        self._sandboxes.set_network(sandbox_id, policy)

    def set_timeout(self, sandbox_id: str, timeout: float) -> None:
        timeout = validate.positive(timeout, "timeout", allow_none=False, maximum=30 * 86400)
        self._sandboxes.row(sandbox_id)
        self.store.update_sandbox(sandbox_id, timeout=float(timeout), last_used=time.time())

    def reset_rootfs(self, sandbox_id: str) -> SandboxInfo:
        """Wipe the system layer (every change outside /workspace); same id, same volume."""
        self._sandboxes.reset_rootfs(sandbox_id)
        return self.info(sandbox_id)

    def kill(self, sandbox_id: str, delete_volume: bool = False) -> None:
        self._ports.close(sandbox_id)
        self._sandboxes.kill(sandbox_id, delete_volume)

    def expose_port(self, sandbox_id: str, port: int) -> str:
        """``http://127.0.0.1:N``: reaches ``port`` inside the sandbox from this host
        through the guest channel (any TCP: HTTP, WebSockets...), whatever its network
        policy, for as long as this engine object lives."""
        self._sandboxes.row(sandbox_id)
        return f"http://{self._ports.expose(sandbox_id, port)}"

    def list_volumes(self) -> list[VolumeInfo]:
        return self._sandboxes.list_volumes()

    def delete_volume(self, volume_id: str) -> None:
        self._sandboxes.delete_volume(volume_id)

    # crash recovery and idle timeouts ---------------------------------------------------
    def recover(self) -> None:
        """Clean up after crashes: half-made sandboxes, orphan containers, mounts, dirs."""
        recovery.recover(self._sandboxes)

    def reap_once(self, now: float | None = None) -> None:
        """Auto-pause sandboxes idle past their timeout; stop long-paused containers."""
        reap_once(self._sandboxes, self.config, now)


def _limits(defaults: Limits, cpu: Any, memory_mb: Any, disk_mb: Any) -> Limits:
    limits = Limits(
        memory_mb=validate.positive(memory_mb, "memory_mb", integer=True, maximum=1 << 20)
        or defaults.memory_mb,
        cpu=validate.positive(cpu, "cpu", maximum=os.cpu_count() or 1) or defaults.cpu,
        pids=defaults.pids,
        disk_mb=validate.positive(disk_mb, "disk_mb", integer=True, maximum=1 << 22)
        or defaults.disk_mb,
    )
    if limits.memory_mb < 32:
        raise InvalidArgumentError("memory_mb must be at least 32")
    if limits.disk_mb < 16:
        raise InvalidArgumentError("disk_mb must be at least 16")
    return limits


def _precompile_guest() -> None:
    """Bytecode for the guest's modules: saves ~20 ms of every sandbox start. Any
    python3 of the same minor version inside a template uses it; others compile."""
    for source in GUEST_DIR.glob("*.py"):
        try:
            py_compile.compile(str(source), doraise=True)
        except (OSError, py_compile.PyCompileError):
            return  # read-only install: the guest still starts, a little slower


def _template_info(t: Template) -> TemplateInfo:
    return TemplateInfo(name=t.name, kind=t.kind, description=t.description, env=t.env,
                        workdir=t.workdir, commands=t.commands, has_kernel=t.kernel is not None,
                        created_at=t.created_at)
