"""The embedded engine: sandbox lifecycle on one Linux host.

Every sandbox is a detached runc container whose PID 1 is our guest agent. The engine
keeps its state in SQLite and the sandbox directories, so any number of engine processes
(an MCP server, the CLI) can share one data dir, and a new process after a crash or
``kill -9`` finds every sandbox again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import py_compile
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from agent_sandbox.errors import (
    InvalidArgumentError,
    NotFoundError,
    RuntimeUnavailableError,
    SandboxTimeoutError,
    WrongStateError,
)
from agent_sandbox.models import (
    CodeContext,
    CommandResult,
    EntryInfo,
    Execution,
    ProcessInfo,
    ProcessOutput,
    Result,
    SandboxInfo,
    TemplateInfo,
    VolumeInfo,
)
from agent_sandbox.runtime import (
    code_template,
    disk,
    rootfs,
    rootless,
    subids,
    supervisor,
    syscalls,
    validate,
)
from agent_sandbox.runtime.activity import Activity
from agent_sandbox.runtime.config import HOST_ID_BASE, EngineConfig, Limits
from agent_sandbox.runtime.guest_client import (
    ExecResult,
    GuestClient,
    GuestProtocolError,
    GuestUnavailableError,
)
from agent_sandbox.runtime.kernels import Kernels
from agent_sandbox.runtime.oci import DEFAULT_PATH, BundleSpec, build_config
from agent_sandbox.runtime.runc import Runc
from agent_sandbox.runtime.sandbox_lock import LOCK_FILE, SandboxLock, held_elsewhere
from agent_sandbox.runtime.store import (
    CREATING,
    KILLING,
    KILLING_VOLUME,
    PAUSED,
    RUNNING,
    SandboxRow,
    Store,
    VolumeRow,
)
from agent_sandbox.runtime.templates import GuestPython, Template, TemplateStore, host_python

GUEST_DIR = Path(__file__).resolve().parent.parent / "guest"
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_READY_TIMEOUT = 15.0
_CONTROL_TIMEOUT = 10.0  # freeze/thaw answers, under the sandbox's lock
_GUEST_OUTPUT_KEPT = 8192  # of what a guest prints before it is ready, for error messages
# last_used is written at most this often per sandbox: idle timeouts are seconds long,
# and a write per exec is a measurable share of a 5 ms round trip.
_TOUCH_EVERY = 1.0
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_BASE_REFRESH_EVERY = 10.0
OutputCallback = Callable[[str], None]


def _new_id() -> str:
    return "sbx-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(10))


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _text_callback(cb: OutputCallback | None) -> Callable[[bytes], None] | None:
    return None if cb is None else (lambda chunk: cb(_decode(chunk)))


class Engine:
    """As root: overlays and disks mounted on the host, one shared id range. As any other
    user: the *rootless* engine (see ``rootless.py``): the user's own ids, overlays that
    runc mounts inside each container, directory volumes, rlimits where no cgroup is
    delegated, pause by stopping processes. Same API either way."""

    def __init__(self, config: EngineConfig | None = None, *, reaper: bool = True) -> None:
        self.rootless = os.geteuid() != 0
        if self.rootless:
            rootless.check_usable()
        else:
            subids.reserve()  # keep useradd's subordinate ranges off our host ids
        self.config = config or EngineConfig()
        data = self.config.data_dir
        # Root: the sandboxes' unprivileged root (group HOST_ID_BASE) must traverse to its
        # rootfs; no other host user may enter (setuid files, sockets, disks below).
        # Rootless: the sandboxes' root is the user; nobody else needs in.
        for path in (data, self.config.sandboxes_dir):
            path.mkdir(parents=True, exist_ok=True)
            _private_dir(path, rootless=self.rootless)
        self._volumes_dir.mkdir(mode=0o700, exist_ok=True)
        if not self.rootless:
            self.config.idmap_dir.mkdir(mode=0o700, exist_ok=True)
        self._cgroups = ("systemd" if rootless.delegated_cgroup() else "") if self.rootless \
            else "cgroupfs"
        self.runc = Runc(self.config.runc_root, systemd_cgroup=self._cgroups == "systemd")
        _precompile_guest()
        self._enforced = rootless.enforced_limits() if self.rootless else _enforced_limits()
        self.store = Store(self.config.db_path)
        self.templates = TemplateStore(self.config.templates_dir, rootless=self.rootless)
        self.views = None if self.rootless else rootfs.IdmapViews(self.config.idmap_dir)
        self._locks: dict[str, SandboxLock] = {}
        self._locks_guard = threading.Lock()
        self._guest_interpreter: GuestPython | None = None
        self._stop = threading.Event()
        self._pool_wake = threading.Event()
        self._activity = Activity(self.store.touch, self._stop)
        self._code = Kernels(self)
        self.recover()
        if reaper:
            threading.Thread(target=self._reap_loop, name="abx-reaper", daemon=True).start()
        if self.config.pool_size > 0:
            self._pool_wake.set()
            threading.Thread(target=self._pool_loop, name="abx-pool", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._pool_wake.set()
        self._code.close()
        # The last process out leaves no host mounts behind when no sandbox exists.
        with contextlib.suppress(Exception):
            self.release_host_mounts()

    # paths ------------------------------------------------------------------------------
    @property
    def _volumes_dir(self) -> Path:
        return self.config.data_dir / "volumes"

    def _dir(self, sandbox_id: str) -> Path:
        return self.config.sandboxes_dir / sandbox_id

    def _volume_image(self, volume_id: str) -> Path:
        """The volume: an ext4 image (root) or a directory (rootless)."""
        if self.rootless:
            return self._volumes_dir / volume_id
        return self._volumes_dir / f"{volume_id}.img"

    def _disk(self, row: SandboxRow) -> Path:
        """Where the sandbox's ``sys/`` and ``workspace/`` are."""
        if self.rootless:
            return self._volume_image(row.volume_id)
        return self._dir(row.id) / "disk"

    def _attach(self, row: SandboxRow) -> None:
        if self.rootless:
            rootless.make_volume(self._volume_image(row.volume_id))
        else:
            disk.attach(self._volume_image(row.volume_id), self._dir(row.id) / "disk",
                        self.config.host_reserve_mb)
        rootfs.sweep_trash(self._disk(row), rootless=self.rootless)  # a crashed reset's

    def _remove_volume_files(self, volume_id: str) -> None:
        if self.rootless:
            rootless.remove_tree(self._volume_image(volume_id))
        else:
            self._volume_image(volume_id).unlink(missing_ok=True)

    def _remove_tree(self, path: Path) -> None:
        if self.rootless:
            rootless.remove_tree(path)
        else:
            shutil.rmtree(path, ignore_errors=True)

    def engine_info(self) -> dict[str, Any]:
        """Which engine runs here and what it really enforces (``abx doctor`` shows it)."""
        if self.rootless:
            mapping = rootless.id_map()
            return {"mode": "rootless", "data_dir": str(self.config.data_dir),
                    "ids": mapping.describe(), "enforced": self._enforced,
                    "limits": rootless.describe_limits(),
                    "pause": "SIGSTOP to every process but the guest (no freezer rootless)",
                    "network": "none, or slirp4netns as the user (network=True)"}
        return {"mode": "root", "data_dir": str(self.config.data_dir),
                "ids": f"0 -> {HOST_ID_BASE} (65536 ids, shared by all sandboxes)",
                "enforced": self._enforced,
                "limits": {name: ("cgroup" if on else "not enforced (controller missing)")
                           if name != "disk" else "ext4 image per sandbox"
                           for name, on in self._enforced.items()},
                "pause": "cgroup freezer", "network": "none, or slirp4netns (network=True)"}

    def disk_headroom(self) -> dict[str, int]:
        """Free bytes on the data dir's filesystem and the reserve creates keep."""
        return {"free_bytes": shutil.disk_usage(self.config.data_dir).free,
                "reserve_bytes": self.config.host_reserve_mb << 20}

    def _socket(self, sandbox_id: str) -> str:
        """The guest's listener: bound by the host in the sandbox's host-only directory
        (never in anything the sandbox can see), handed to the guest as fd 3."""
        return str(self._dir(sandbox_id) / "guest.sock")

    def _lock(self, sandbox_id: str) -> SandboxLock:
        """The sandbox's lifecycle lock: this process's threads and other processes."""
        with self._locks_guard:
            lock = self._locks.get(sandbox_id)
            if lock is None:
                lock = self._locks[sandbox_id] = SandboxLock(sandbox_id, self._dir(sandbox_id))
            return lock

    # templates --------------------------------------------------------------------------
    def list_templates(self) -> list[TemplateInfo]:
        return [_template_info(t) for t in self.templates.list()]

    def get_template(self, name: str) -> Template:
        return self.templates.get(name)

    def _refuse_if_used(self, name: str) -> None:
        in_use = [r.id for r in self.store.list_sandboxes() if r.template == name]
        if in_use:
            raise WrongStateError(f"template {name!r} is used by sandboxes {', '.join(in_use)}; "
                                  "kill them first")

    def remove_template(self, name: str) -> None:
        self._refuse_if_used(name)
        own = str(self.templates.path(name)) + "/"
        lowers = [lower for layer in self.templates.get(name).layers
                  for lower in layer.lowers if lower.startswith(own)]  # not shared ones
        self.templates.remove(name)
        if self.views is not None:
            self.views.forget(lowers)

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
        network: bool = False,
        persistent: bool = False,
        metadata: dict[str, str] | None = None,
        volume: str | None = None,
        owner: str = "",
    ) -> SandboxInfo:
        if template == code_template.NAME:
            code_template.ensure(self.templates)  # built on first use (minutes, once)
        tmpl = self.templates.get(template)
        defaults = self.config.limits
        limits = Limits(
            memory_mb=validate.positive(memory_mb, "memory_mb", integer=True, maximum=1 << 20)
            or defaults.memory_mb,
            cpu=validate.positive(cpu, "cpu", maximum=os.cpu_count() or 1) or defaults.cpu,
            pids=defaults.pids,
            disk_mb=validate.positive(disk_mb, "disk_mb", integer=True, maximum=1 << 22)
            or defaults.disk_mb,
        )
        timeout = validate.positive(timeout, "timeout", allow_none=False, maximum=30 * 86400)
        if not isinstance(network, bool) or not isinstance(persistent, bool):
            raise InvalidArgumentError("network and persistent must be true or false")
        if limits.memory_mb < 32:
            raise InvalidArgumentError("memory_mb must be at least 32")
        if limits.disk_mb < 16:
            raise InvalidArgumentError("disk_mb must be at least 16")
        envs = validate.envs(envs)
        metadata = validate.metadata(metadata)
        if network and self.rootless and (problem := rootless.network_problem()):
            raise RuntimeUnavailableError(problem)
        if (volume is None and not network and limits == self.config.limits
                and tmpl.name in self.config.pool_templates and self.config.pool_size > 0):
            claimed = self._claim_pooled(tmpl.name, timeout=float(timeout),
                                         persistent=persistent, envs=envs, metadata=metadata,
                                         owner=owner)
            if claimed is not None:
                return claimed
        sandbox_id = _new_id()
        now = time.time()
        row = SandboxRow(
            id=sandbox_id, template=tmpl.name, state="creating", created_at=now, last_used=now,
            timeout=float(timeout), persistent=persistent, network=network,
            volume_id=volume or f"vol-{sandbox_id[4:]}", envs=envs, metadata=metadata,
            limits=limits.__dict__,
            layers=[{"target": layer.target, "lowers": layer.lowers} for layer in tmpl.layers],
            owner=owner,
        )
        if volume is not None:
            found = self.store.get_volume(volume) if isinstance(volume, str) else None
            if found is None:
                raise NotFoundError(f"volume {volume!r} not found")
            if not self.store.claim_volume(volume, sandbox_id):
                raise WrongStateError(f"volume {volume!r} is attached to sandbox "
                                      f"{found.attached_to}")
        self._make(row, new_volume=volume is None, final_state="running")
        return self.info(sandbox_id)

    def _make(self, row: SandboxRow, *, new_volume: bool, final_state: str) -> None:
        sbdir = self._dir(row.id)
        sbdir.mkdir(mode=0o700)
        _private_dir(sbdir, rootless=self.rootless)
        # Held for the whole create: recovery treats an unlocked "creating" row as a crash.
        create_lock = open(sbdir / "create.lock", "w")  # noqa: SIM115
        fcntl.flock(create_lock, fcntl.LOCK_EX)
        self.store.insert_sandbox(row)
        try:
            if new_volume:
                disk_mb = row.limits["disk_mb"]
                if self.rootless:  # a directory (made as it boots): no size limit
                    disk.check_free(self._volumes_dir, self.config.host_reserve_mb)
                else:
                    disk.create_image(self._volume_image(row.volume_id), disk_mb,
                                      self.config.data_dir / "blank",
                                      self.config.host_reserve_mb)
                self.store.upsert_volume(VolumeRow(row.volume_id, disk_mb, row.created_at,
                                                   row.id))
            self._boot(row)
            self.store.update_sandbox(row.id, state=final_state, last_used=time.time())
        except BaseException:
            self._destroy(row, delete_volume=new_volume)
            raise
        finally:
            create_lock.close()

    # warm pool --------------------------------------------------------------------------
    def _claim_pooled(self, template: str, **fields: Any) -> SandboxInfo | None:
        now = time.time()
        while True:
            sandbox_id = self.store.claim_pooled(template, self.config.limits.__dict__,
                                                 created_at=now, last_used=now, **fields)
            self._pool_wake.set()
            if sandbox_id is None:
                return None
            try:
                GuestClient(self._socket(sandbox_id), connect_timeout=1.0).ping()
                return self.info(sandbox_id)
            except GuestUnavailableError:
                # A pooled sandbox that died meanwhile (host reboot): drop it, try another.
                row = self.store.get_sandbox(sandbox_id)
                if row is not None:
                    self._destroy(row, delete_volume=True)

    def _pool_loop(self) -> None:
        while not self._stop.is_set():
            self._pool_wake.wait(timeout=30)
            self._pool_wake.clear()
            for template in self.config.pool_templates:
                try:
                    self._fill_pool(template)
                except Exception:  # noqa: BLE001 - a failed refill must not end the loop
                    self._stop.wait(5)

    def _fill_pool(self, template: str) -> None:
        tmpl = self.templates.get(template)
        while not self._stop.is_set() and \
                self.store.count_pooled(template) < self.config.pool_size:
            sandbox_id = _new_id()
            now = time.time()
            row = SandboxRow(
                id=sandbox_id, template=tmpl.name, state="creating", created_at=now,
                last_used=now, timeout=300.0, persistent=False, network=False,
                volume_id=f"vol-{sandbox_id[4:]}", limits=self.config.limits.__dict__,
                layers=[{"target": x.target, "lowers": x.lowers} for x in tmpl.layers],
            )
            self._make(row, new_volume=True, final_state="pooled")

    def release_host_mounts(self) -> None:
        """Unmount the template views once no sandbox exists (before deleting the data
        dir: the views are read-only, but a recursive delete must not walk into them)."""
        def in_use() -> bool:
            return bool(self.store.list_sandboxes())

        released = self.views.release(in_use) if self.views is not None else not in_use()
        if not released:
            raise WrongStateError("sandboxes still exist; kill them first")

    def drain_pool(self) -> int:
        """Destroy every warm, unclaimed sandbox; returns how many."""
        drained = 0
        for row in self.store.list_sandboxes():
            if row.state == "pooled":
                self._destroy(row, delete_volume=True)
                drained += 1
        return drained

    def _boot(self, row: SandboxRow) -> None:
        """Mount disk and root filesystem, write the bundle, start the container."""
        supervisor.ensure_running(self.config)  # its idle timeout outlives this process
        sbdir = self._dir(row.id)
        self._attach(row)
        run_dir = sbdir / "run"
        run_dir.mkdir(mode=0o700, exist_ok=True)
        limits = Limits(**row.limits)
        if self.rootless:
            # Overlays are mounted by runc inside the container's user namespace; the
            # run dir is a plain directory (no tmpfs without root: no size limit).
            (sbdir / "rootfs").mkdir(exist_ok=True)
            extra: dict[str, Any] = {
                "id_map": rootless.id_map().oci(),
                "rootfs_mounts": tuple(rootfs.overlay_mounts(self._disk(row) / disk.SYSTEM,
                                                             row.layers)),
                "rlimits": tuple(rootless.rlimits(limits, cgroups=bool(self._cgroups))),
                "cgroups": self._cgroups,
            }
            guest_env = rootless.guest_env(limits, cgroups=bool(self._cgroups))
        else:
            assert self.views is not None
            rootfs.mount_rootfs(sbdir / "rootfs", sbdir / "disk" / disk.SYSTEM, row.layers,
                                self.views)
            # The guest's socket and log live on a tiny tmpfs: the sandbox sees this
            # directory, and must not be able to fill the host's disk through it.
            if not os.path.ismount(run_dir):
                syscalls.mount("tmpfs", str(run_dir), "tmpfs",
                               _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                               f"size=4m,nr_inodes=1024,mode=0700,uid={HOST_ID_BASE},"
                               f"gid={HOST_ID_BASE}")
            extra, guest_env = {}, []
        # The guest runs on the host's python from a read-only view of the host's /usr,
        # never on anything in the sandbox's writable layers.
        guest = self._guest_python()
        spec = BundleSpec(
            sandbox_id=row.id, rootfs=str(sbdir / "rootfs"),
            workspace=str(self._disk(row) / disk.WORKSPACE), run_dir=str(run_dir),
            guest_dir=str(GUEST_DIR), python=guest.argv, limits=limits,
            network=row.network, extra_mounts=tuple(guest.mounts),
            empty_file=str(self._empty_file()), **extra,
        )
        config = build_config(spec)
        config["process"]["env"] += [f"{k}={v}" for k, v in guest.env.items()]
        config["process"]["env"] += guest_env
        (sbdir / "config.json").write_text(json.dumps(config))
        listener = _listen(self._socket(row.id))
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                self.runc.run_detached(row.id, sbdir, listener.fileno(), out_w)
            finally:
                os.close(out_w)
                listener.close()  # the guest holds it now; dies with the container
            self._wait_ready(row.id, out_r)
        finally:
            os.close(out_r)  # the guest's later output goes nowhere
        if row.network:
            self._start_network(row)

    def _guest_python(self) -> GuestPython:
        if self._guest_interpreter is None:
            self._guest_interpreter = host_python()
        return self._guest_interpreter

    def _empty_file(self) -> Path:
        """A host-owned empty read-only file, mounted over what no sandbox may feed the
        guest's loader (/etc/ld.so.preload)."""
        path = self.config.data_dir / "empty"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o444)
            os.close(fd)
        return path

    def _control(self, sandbox_id: str) -> GuestClient:
        """For calls made under the sandbox's lock: a guest that stalls must not hold the
        lock (and the reaper) for long."""
        return GuestClient(self._socket(sandbox_id), io_timeout=_CONTROL_TIMEOUT)

    def _template_for(self, row: SandboxRow) -> Template:
        try:
            return self.templates.get(row.template)
        except NotFoundError:
            # The template was removed after the sandbox was made: its layers are frozen
            # in the row; the guest interpreter falls back to the default.
            return Template(name=row.template, kind="gone", layers=[])

    def _wait_ready(self, sandbox_id: str, output: int) -> None:
        """Until the guest answers a ping. The listener exists before the guest runs,
        so a connection waits in its backlog (no polling for a file); a refused one
        means the guest is gone. What the guest printed meanwhile (read from a pipe,
        bounded) explains a failure."""
        deadline = time.monotonic() + _READY_TIMEOUT
        client = GuestClient(self._socket(sandbox_id), connect_timeout=1.0)
        printed = bytearray()
        os.set_blocking(output, False)
        while True:
            left = deadline - time.monotonic()
            try:
                client.ping_within(max(0.01, min(left, 1.0)))
                return
            except (GuestUnavailableError, SandboxTimeoutError) as exc:
                gone = isinstance(exc, GuestUnavailableError) and "refused" in str(exc)
            _read_some(output, printed, _GUEST_OUTPUT_KEPT)
            if gone or time.monotonic() > deadline:
                text = _printable(printed.decode("utf-8", errors="replace"))[-2000:]
                why = "exited" if gone else f"did not start within {_READY_TIMEOUT:.0f}s"
                raise RuntimeUnavailableError(
                    f"sandbox {sandbox_id}'s guest {why}; its output: {text.strip() or '(none)'}")
            if not gone:
                time.sleep(0.002)

    def _start_network(self, row: SandboxRow) -> None:
        """User-mode networking (slirp4netns): the internet only, never the host or the LAN
        (egress.py's filter, in each boot's new netns before tap0 exists)."""
        from agent_sandbox.runtime import egress

        state = self.runc.state(row.id)
        if not state or not shutil.which("slirp4netns"):
            raise RuntimeUnavailableError("network=True needs slirp4netns "
                                          "(apt-get install slirp4netns)")
        egress.install(state["pid"], rootless=self.rootless)
        self._stop_helper(row.id)  # the previous boot's, serving a netns that is gone
        log = open(self._dir(row.id) / "slirp.log", "ab")  # noqa: SIM115
        ready_r, ready_w = os.pipe()
        proc = subprocess.Popen(
            ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
             f"--ready-fd={ready_w}", str(state["pid"]), "tap0"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            pass_fds=(ready_w,),
        )
        log.close()
        os.close(ready_w)
        self.store.update_sandbox(row.id, helper_pid=proc.pid)
        # Return only once tap0 is configured: a command right after create must see it.
        try:
            ready, _, _ = select.select([ready_r], [], [], 10)
            if not ready or not os.read(ready_r, 1):
                raise RuntimeUnavailableError("slirp4netns did not configure the network; "
                                              f"see {self._dir(row.id) / 'slirp.log'}")
        finally:
            os.close(ready_r)

    def _stop_helper(self, sandbox_id: str) -> None:
        """End the sandbox's slirp4netns, if the recorded pid still is one (a pid from the
        database may have been reused by anything since)."""
        row = self.store.get_sandbox(sandbox_id)
        pid = row.helper_pid if row is not None else 0
        if not pid:
            return
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            argv = []
        if argv and os.path.basename(argv[0]) == b"slirp4netns":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.store.update_sandbox(sandbox_id, helper_pid=0)

    def _destroy(self, row: SandboxRow, *, delete_volume: bool) -> None:
        """Tear everything down; each step tolerates what is already gone."""
        sbdir = self._dir(row.id)
        self.runc.delete(row.id)
        self._stop_helper(row.id)
        volume = self.store.get_volume(row.volume_id)
        if self.rootless:  # nothing mounted on the host: the volume is a directory
            if not delete_volume:
                rootfs.wipe_system_layer(self._disk(row) / disk.SYSTEM, rootless=True)
        else:
            rootfs.unmount_rootfs(sbdir / "rootfs")
            mnt = sbdir / "disk"
            if not delete_volume and os.path.ismount(mnt):
                rootfs.wipe_system_layer(mnt / disk.SYSTEM)
                disk.trim(mnt)
            disk.detach(mnt)
        if delete_volume:
            self._remove_volume_files(row.volume_id)
            if volume is not None and volume.attached_to == row.id:
                self.store.delete_volume(row.volume_id)
        elif volume is not None:
            self.store.upsert_volume(VolumeRow(volume.id, volume.size_mb,
                                               volume.created_at, ""))
        if not self.rootless:
            rootfs.unmount_rootfs(sbdir)  # the run tmpfs, and anything left over
        self._remove_tree(sbdir)
        self.store.delete_sandbox(row.id)

    def _row(self, sandbox_id: str) -> SandboxRow:
        validate.sandbox_id(sandbox_id)
        row = self.store.get_sandbox(sandbox_id)
        if row is None or row.state not in ("running", "paused"):
            raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)")
        return row

    def info(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self._row(sandbox_id))

    def _info(self, row: SandboxRow) -> SandboxInfo:
        return SandboxInfo(
            sandbox_id=row.id, template=row.template, state=row.state,
            created_at=row.created_at, last_used=row.last_used, timeout=row.timeout,
            persistent=row.persistent, network=row.network, volume_id=row.volume_id,
            metadata=row.metadata, envs=row.envs, limits=row.limits,
            enforced=self._enforced,
        )

    def list(self, template: str | None = None, state: str | None = None,
             owner: str | None = None) -> list[SandboxInfo]:
        if state is not None and state not in ("running", "paused"):
            raise InvalidArgumentError(f"state must be 'running' or 'paused', got {state!r}")
        return [
            self._info(r) for r in self.store.list_sandboxes()
            if r.state in ("running", "paused")
            and (template is None or r.template == template)
            and (state is None or r.state == state)
            and (owner is None or r.owner == owner)
        ]

    def pause(self, sandbox_id: str) -> SandboxInfo:
        with self._lock(sandbox_id):
            row = self._row(sandbox_id)
            if row.state == "paused":
                return self._info(row)
            self._ensure_container(row)
            # The row first: a crash before the freeze leaves "paused" over a running
            # container, which the next use sorts out; the other order left "running"
            # over a frozen guest, and every call waited on it.
            self.store.update_sandbox(sandbox_id, state=PAUSED)
            try:
                if self.rootless:
                    self._control(sandbox_id).freeze()
                else:
                    self.runc.pause(sandbox_id)
            except BaseException:
                self.store.update_sandbox(sandbox_id, state=RUNNING)
                raise
        return self.info(sandbox_id)

    def resume(self, sandbox_id: str) -> SandboxInfo:
        self._guest(sandbox_id)
        return self.info(sandbox_id)

    def set_timeout(self, sandbox_id: str, timeout: float) -> None:
        timeout = validate.positive(timeout, "timeout", allow_none=False, maximum=30 * 86400)
        self._row(sandbox_id)
        self.store.update_sandbox(sandbox_id, timeout=float(timeout), last_used=time.time())

    def reset_rootfs(self, sandbox_id: str) -> SandboxInfo:
        """Wipe the system layer (every change outside /workspace); same id, same volume."""
        with self._lock(sandbox_id):
            row = self._row(sandbox_id)
            sbdir = self._dir(sandbox_id)
            self._code.forget(sandbox_id)  # kernels end with the container
            self.runc.delete(sandbox_id)
            rootfs.unmount_rootfs(sbdir / "rootfs")
            self._attach(row)
            rootfs.wipe_system_layer(self._disk(row) / disk.SYSTEM, rootless=self.rootless)
            self._boot(row)
            self.store.update_sandbox(sandbox_id, state="running", last_used=time.time())
        return self.info(sandbox_id)

    def kill(self, sandbox_id: str, delete_volume: bool = False) -> None:
        with self._lock(sandbox_id):
            row = self._row(sandbox_id)
            # Hidden from now on, and the answer about its volume is on record: a crash
            # from here is finished by recover() the same way (the lock tells it we died).
            self.store.update_sandbox(sandbox_id,
                                      state=KILLING_VOLUME if delete_volume else KILLING)
            self._code.forget(sandbox_id, keep_contexts=False)
            self._destroy(row, delete_volume=delete_volume)
        with self._locks_guard:
            self._locks.pop(sandbox_id, None)

    # volumes ----------------------------------------------------------------------------
    def list_volumes(self) -> list[VolumeInfo]:
        return [VolumeInfo(volume_id=v.id, size_mb=v.size_mb, created_at=v.created_at,
                           attached_to=v.attached_to) for v in self.store.list_volumes()]

    def delete_volume(self, volume_id: str) -> None:
        found = self.store.get_volume(volume_id) if isinstance(volume_id, str) else None
        if found is None:
            raise NotFoundError(f"volume {volume_id!r} not found")
        if found.attached_to:
            raise WrongStateError(f"volume {volume_id} is attached to {found.attached_to}")
        self._remove_volume_files(volume_id)
        self.store.delete_volume(volume_id)

    # the guest --------------------------------------------------------------------------
    def _ensure_container(self, row: SandboxRow) -> str:
        """The container's runc status, rebooting it if it is gone (host reboot, crash)."""
        state = self.runc.state(row.id)
        status = state["status"] if state else "missing"
        if status in ("running", "paused"):
            return status
        with self._lock(row.id):
            state = self.runc.state(row.id)
            if state and state["status"] in ("running", "paused"):
                return state["status"]
            self.runc.delete(row.id)
            rootfs.unmount_rootfs(self._dir(row.id) / "rootfs")
            self._boot(row)
            self.store.update_sandbox(row.id, state="running")
            return "running"

    def _guest(self, sandbox_id: str, row: SandboxRow | None = None) -> GuestClient:
        """A client for a running sandbox: resumes a paused one, extends its life."""
        row = row or self._row(sandbox_id)
        if row.state == "paused" or not os.path.exists(self._socket(sandbox_id)):
            with self._lock(sandbox_id):
                row = self._row(sandbox_id)
                if self._ensure_container(row) == "paused":
                    self.runc.resume(sandbox_id)
                elif self.rootless and row.state == "paused":
                    self._control(sandbox_id).thaw()
                self.store.update_sandbox(sandbox_id, state="running", last_used=time.time())
            supervisor.ensure_running(self.config)
        elif time.time() - row.last_used > _TOUCH_EVERY:
            self.store.touch(sandbox_id)
        return GuestClient(self._socket(sandbox_id))

    def _call(self, sandbox_id: str, fn: Callable[[GuestClient], Any],
              row: SandboxRow | None = None) -> Any:
        """Run a guest operation; if the guest is gone (OOM, crash), reboot it once. A
        guest that breaks the protocol is stopped: the next call boots a genuine one."""
        client = self._guest(sandbox_id, row)
        try:
            with self._activity.busy(sandbox_id):
                try:
                    return fn(client)
                except GuestUnavailableError:
                    row = self._row(sandbox_id)
                    state = self.runc.state(sandbox_id)
                    if state and state["status"] in ("running", "paused"):
                        raise
                    self._ensure_container(row)
                    return fn(GuestClient(self._socket(sandbox_id)))
        except GuestProtocolError as exc:
            with self._lock(sandbox_id):
                self._code.forget(sandbox_id)
                self.runc.delete(sandbox_id)
            raise GuestProtocolError(f"sandbox {sandbox_id} misbehaved and was stopped ({exc}); "
                                     "its next use restarts it, without its processes") from None

    def _env(self, row: SandboxRow, extra: dict[str, str] | None) -> dict[str, str]:
        tmpl = self._template_for(row)
        env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm",
               "SANDBOX_ID": row.id}
        env.update(tmpl.env)
        env.update(row.envs)
        env.update(validate.envs(extra))
        return env

    def run(
        self,
        sandbox_id: str,
        cmd: str,
        cwd: str | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> CommandResult:
        cmd = validate.command(cmd)
        row = self._row(sandbox_id)
        cwd = validate.path(cwd or self._template_for(row).workdir, "cwd")
        timeout = validate.positive(timeout, "timeout", maximum=86400) or \
            self.config.command_timeout
        env = self._env(row, envs)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        result: ExecResult = self._call(sandbox_id, lambda g: g.exec(
            ["/bin/sh", "-c", cmd], cwd=cwd, env=env, timeout=timeout,
            max_output=self.config.max_output, stdin=data,
            on_stdout=_text_callback(on_stdout), on_stderr=_text_callback(on_stderr),
        ), row)
        return _command_result(result)

    def start(self, sandbox_id: str, cmd: str, cwd: str | None = None,
              envs: dict[str, str] | None = None) -> int:
        cmd = validate.command(cmd)
        row = self._row(sandbox_id)
        cwd = validate.path(cwd or self._template_for(row).workdir, "cwd")
        env = self._env(row, envs)
        return self._call(sandbox_id, lambda g: g.start(
            ["/bin/sh", "-c", cmd], cwd=cwd, env=env, max_output=self.config.max_output,
            stdin_open=True,
        ), row)

    def process_output(self, sandbox_id: str, pid: int) -> ProcessOutput:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        out = self._call(sandbox_id, lambda g: g.output(pid, self.config.max_output))
        return ProcessOutput(pid=pid, stdout=_decode(out.stdout), stderr=_decode(out.stderr),
                             running=out.running, exit_code=out.exit_code,
                             truncated=out.truncated)

    def wait(self, sandbox_id: str, pid: int, timeout: float | None = None,
             on_stdout: OutputCallback | None = None,
             on_stderr: OutputCallback | None = None) -> CommandResult:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        timeout = validate.positive(timeout, "timeout", maximum=86400)
        result = self._call(sandbox_id, lambda g: g.wait(
            pid, timeout=timeout, on_stdout=_text_callback(on_stdout),
            on_stderr=_text_callback(on_stderr)))
        return _command_result(result)

    def kill_process(self, sandbox_id: str, pid: int, sig: int = signal.SIGKILL) -> bool:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        return self._call(sandbox_id, lambda g: g.kill(pid, int(sig)))

    def send_stdin(self, sandbox_id: str, pid: int, data: str | bytes,
                   close: bool = False) -> None:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        raw = data.encode() if isinstance(data, str) else data
        self._call(sandbox_id, lambda g: g.send_stdin(pid, raw, close=close))

    def processes(self, sandbox_id: str) -> list[ProcessInfo]:
        procs = self._call(sandbox_id, lambda g: g.ps())
        return [_process(p) for p in procs]

    def custom(self, sandbox_id: str, name: str, args: list[str] | None = None,
               **kw: Any) -> CommandResult:
        row = self._row(sandbox_id)
        commands = self._template_for(row).commands
        if name not in commands:
            known = ", ".join(sorted(commands)) or "none"
            raise NotFoundError(f"template {row.template!r} has no custom command {name!r} "
                                f"(available: {known})")
        if args is not None and not all(isinstance(a, str) for a in args):
            raise InvalidArgumentError("custom command args must be strings")
        cmd = commands[name]["cmd"] + "".join(" " + shlex.quote(a) for a in args or [])
        return self.run(sandbox_id, cmd, **kw)

    # code interpreter -------------------------------------------------------------------
    def run_code(self, sandbox_id: str, code: str, language: str = "python",
                 timeout: float | None = 60, context: str | CodeContext | None = None,
                 on_stdout: OutputCallback | None = None,
                 on_stderr: OutputCallback | None = None,
                 on_result: Callable[[Result], None] | None = None) -> Execution:
        """Run a cell in the context's Jupyter kernel (``default`` unless given); the
        kernel starts on first use and keeps its variables between calls."""
        ctx = context.id if isinstance(context, CodeContext) else context
        with self._activity.busy(sandbox_id):
            return self._code.run_code(sandbox_id, code, language=language, timeout=timeout,
                                       context=ctx, on_stdout=on_stdout, on_stderr=on_stderr,
                                       on_result=on_result)

    def create_code_context(self, sandbox_id: str, cwd: str | None = None,
                            language: str = "python") -> CodeContext:
        """A new, independent interpreter in the sandbox (its own kernel)."""
        return self._code.create_context(sandbox_id, cwd=cwd, language=language)

    def restart_code_context(self, sandbox_id: str,
                             context: str | CodeContext | None = None) -> None:
        ctx = context.id if isinstance(context, CodeContext) else context
        self._code.restart_context(sandbox_id, ctx)

    def list_code_contexts(self, sandbox_id: str) -> list[CodeContext]:
        return self._code.list_contexts(sandbox_id)

    # files ------------------------------------------------------------------------------
    def read_file(self, sandbox_id: str, path: str, offset: int = 0,
                  limit: int | None = None) -> Iterator[bytes]:
        path = validate.path(path)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"offset must be a whole number >= 0, got {offset!r}")
        limit = validate.positive(limit, "limit", integer=True)
        chunks = self._call(sandbox_id, lambda g: g.read(path, offset=offset, limit=limit))
        # Pull the first chunk now so errors (missing file) surface at the call site.
        first = next(chunks, None)

        def stream() -> Iterator[bytes]:
            with self._activity.busy(sandbox_id):  # a slow download is activity
                if first is not None:
                    yield first
                yield from chunks

        return stream()

    def write_file(self, sandbox_id: str, path: str,
                   data: bytes | str | Iterable[bytes] | IO[bytes], mode: int = 0o644) -> int:
        path = validate.path(path)
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise InvalidArgumentError(f"mode must be a permission number such as 0o644, "
                                       f"got {mode!r}")
        payload = data.encode() if isinstance(data, str) else data
        return self._call(sandbox_id, lambda g: g.write(path, payload, mode=mode))

    def list_files(self, sandbox_id: str, path: str, depth: int = 1) -> list[EntryInfo]:
        path = validate.path(path)
        depth = validate.positive(depth, "depth", allow_none=False, integer=True, maximum=64)
        return [_entry(e) for e in self._call(sandbox_id, lambda g: g.list(path, depth=depth))]

    def stat(self, sandbox_id: str, path: str) -> EntryInfo:
        path = validate.path(path)
        return _entry(self._call(sandbox_id, lambda g: g.stat(path)))

    def exists(self, sandbox_id: str, path: str) -> bool:
        path = validate.path(path)
        return self._call(sandbox_id, lambda g: g.exists(path))

    def make_dir(self, sandbox_id: str, path: str) -> None:
        path = validate.path(path)
        self._call(sandbox_id, lambda g: g.mkdir(path, parents=True))

    def remove(self, sandbox_id: str, path: str) -> None:
        path = validate.path(path)
        self._call(sandbox_id, lambda g: g.remove(path, recursive=True))

    def rename(self, sandbox_id: str, src: str, dst: str) -> None:
        src = validate.path(src, "source path")
        dst = validate.path(dst, "destination path")
        self._call(sandbox_id, lambda g: g.rename(src, dst))

    # recovery and the reaper ------------------------------------------------------------
    def recover(self) -> None:
        """Clean up after crashes: half-made sandboxes, orphan containers, mounts, dirs."""
        rows = {r.id: r for r in self.store.list_sandboxes()}
        for row in rows.values():
            if row.state == CREATING and self._creator_gone(row.id):
                self._destroy(row, delete_volume=row.volume_id == f"vol-{row.id[4:]}")
            elif row.state in (KILLING, KILLING_VOLUME) and \
                    not held_elsewhere(self._dir(row.id) / LOCK_FILE):
                self._destroy(row, delete_volume=row.state == KILLING_VOLUME)
        live = {r.id: r for r in self.store.list_sandboxes()}
        for container_id, status in self.runc.list_states().items():
            if container_id not in live:
                if self.store.get_sandbox(container_id) is None:  # not one made meanwhile
                    self.runc.delete(container_id)
            elif status == "paused" and live[container_id].state == RUNNING:
                # Frozen under a "running" row (an older engine died mid-pause).
                self.store.update_sandbox(container_id, state=PAUSED)
        for sbdir in self.config.sandboxes_dir.iterdir():
            if sbdir.name not in live and self._creator_gone(sbdir.name) and \
                    self.store.get_sandbox(sbdir.name) is None:
                rootfs.unmount_rootfs(sbdir)
                self._remove_tree(sbdir)

    def _creator_gone(self, sandbox_id: str) -> bool:
        return not held_elsewhere(self._dir(sandbox_id) / "create.lock")

    def reap_once(self, now: float | None = None) -> None:
        """Auto-pause sandboxes idle past their timeout; stop the containers of ones
        paused for long, releasing their memory (disk kept; the next use boots them
        again, without the processes they had)."""
        now = time.time() if now is None else now
        stop_after = self.config.paused_stop_after
        for row in self.store.list_sandboxes():
            idle_until = row.last_used + row.timeout
            try:
                if self._activity.active(row.id):
                    continue  # a call is in flight: not idle, whatever last_used says
                if row.state == "running" and idle_until < now:
                    self.pause(row.id)
                elif row.state == "paused" and idle_until + stop_after < now:
                    with self._lock(row.id):
                        state = self.runc.state(row.id)
                        # Rootless containers stay "running" for runc (stopped processes).
                        if state and state["status"] in ("paused", "running"):
                            self.runc.delete(row.id)
            except Exception:  # noqa: BLE001 - one bad sandbox must not stop the reaper
                continue

    def _reap_loop(self) -> None:
        last_refresh = time.monotonic()
        while not self._stop.wait(self.config.reaper_interval):
            try:
                self.reap_once()
                if time.monotonic() - last_refresh > _BASE_REFRESH_EVERY:
                    last_refresh = time.monotonic()
                    self.templates.refresh_base()  # new sandboxes see the host's new /etc
            except Exception:  # noqa: BLE001 - keep reaping whatever happened
                continue


def _private_dir(path: Path, *, rootless: bool) -> None:
    """Root: root:HOST_ID_BASE 0710, traversable by the sandboxes' root only. Rootless:
    0700, the user's own."""
    if rootless:
        os.chmod(path, 0o700)
    else:
        os.chown(path, 0, HOST_ID_BASE)
        os.chmod(path, 0o710)


def _listen(path: str) -> socket.socket:
    """A fresh listener at ``path`` (a host-only directory), 0600."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def _read_some(fd: int, into: bytearray, keep: int) -> None:
    """Whatever a non-blocking pipe holds now, keeping only the last ``keep`` bytes."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        into += chunk
        del into[:-keep]


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


def _enforced_limits() -> dict[str, bool]:
    """Which limits this host really enforces: each needs its cgroup controller (v1
    directory, or listed in the v2 root's controllers); disk is a filesystem per sandbox."""
    root = Path("/sys/fs/cgroup")
    v2 = (root / "cgroup.controllers").read_text().split() \
        if (root / "cgroup.controllers").exists() else []

    def has(v1: str, v2_name: str) -> bool:
        return (root / v1).is_dir() or v2_name in v2

    return {"memory": has("memory", "memory"), "pids": has("pids", "pids"),
            "cpu": has("cpu", "cpu"), "disk": True}


def _precompile_guest() -> None:
    """Bytecode for the guest's modules: saves ~20 ms of every sandbox start. Any
    python3 of the same minor version inside a template uses it; others compile."""
    for source in GUEST_DIR.glob("*.py"):
        try:
            py_compile.compile(str(source), doraise=True)
        except (OSError, py_compile.PyCompileError):
            return  # read-only install: the guest still starts, a little slower


def _argv_text(argv: list[str]) -> str:
    if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]:
        return argv[2]
    return shlex.join(argv)


def _command_result(result: ExecResult) -> CommandResult:
    return CommandResult(exit_code=result.exit_code, stdout=_decode(result.stdout),
                         stderr=_decode(result.stderr), truncated=result.truncated,
                         timed_out=result.timed_out, pid=result.pid)


def _guest_model(build: Callable[[], Any]) -> Any:
    """A model from guest data; what does not fit is the guest misbehaving."""
    try:
        return build()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # pydantic's too
        raise GuestProtocolError(f"the guest sent a malformed record: {str(exc)[:200]}") from None


def _entry(raw: dict[str, Any]) -> EntryInfo:
    return _guest_model(lambda: EntryInfo(
        name=raw["name"], path=raw["path"], type=raw["type"], size=raw["size"],
        mode=raw["mode"], mtime=raw["mtime"], symlink_target=raw.get("target")))


def _process(raw: dict[str, Any]) -> ProcessInfo:
    return _guest_model(lambda: ProcessInfo(
        pid=raw["pid"], cmd=_argv_text(raw["argv"]), running=raw["running"],
        exit_code=raw.get("exit_code"), started_at=raw.get("started_at", 0)))


def _template_info(t: Template) -> TemplateInfo:
    return TemplateInfo(name=t.name, kind=t.kind, description=t.description, env=t.env,
                        workdir=t.workdir, commands=t.commands, has_kernel=t.kernel is not None,
                        created_at=t.created_at)
