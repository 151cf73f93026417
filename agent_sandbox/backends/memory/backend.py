"""Sandboxes whose state lives in this process's memory: ``ABX_ENGINE=memory``.

Each sandbox is the real guest agent, started by ``bwrap`` in its own mount, pid, ipc, uts
and network namespaces over an empty in-memory root (the host's /usr read-only, a small
/etc of its own, /workspace a directory of this backend); its record, its volumes and its
templates (``base`` alone) are this process's, gone with it. Every call goes through the
same guest protocol, so what the service and the surfaces above it do is exercised for
real, at a fraction of a container's cost.

It is for tests of the layers above the backend and for development: **not an isolation
boundary** (no user namespace, no seccomp, no cgroup limits; ``enforced`` says so), never
chosen unless asked for, and refused by the gateway beyond loopback like any engine
without a key.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.errors import (
    NotFoundError,
    RuntimeUnavailableError,
    WrongStateError,
)
from agent_sandbox.core.inside import DEFAULT_PATH, GUEST_DIR, GUEST_RUN_DIR
from agent_sandbox.core.metrics import Usage
from agent_sandbox.core.models import TemplateInfo, VolumeInfo
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import VISIBLE, SandboxState
from agent_sandbox.core.templates import BASE, Template
from agent_sandbox.guest import SOURCE_DIR as GUEST_SOURCE
from agent_sandbox.guestlink.channel import guest_listener
from agent_sandbox.guestlink.client import GuestClient, GuestUnavailableError
from agent_sandbox.service.backend import NoSnapshots, ServiceHooks
from agent_sandbox.service.code.files import KernelFiles
from agent_sandbox.service.record import SandboxRecord

if TYPE_CHECKING:
    from agent_sandbox.service.code.files import KernelHost

_READY_TIMEOUT = 15.0
_SOCKET = "guest.sock"  # in the host-only sandbox dir
_BOOT = f"import sys; sys.path.insert(0, {GUEST_DIR!r}); import agent; agent.main()"
_PASSWD = ("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
           "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
_GROUP = "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"
_BASE = Template(name=BASE, kind="base", layers=[], description="the host's /usr, read-only")


class MemoryBackend(NoSnapshots):
    snapshot_refusal = ("memory snapshots need the runc engine with CRIU; the memory "
                        "backend (ABX_ENGINE=memory) has none")

    name = "memory"
    injects_secrets = True  # checked and resolved by the service; no proxy sends them here
    sandbox_owner = None
    enforced = {"memory": False, "cpu": False, "pids": False, "disk": False,
                "network": False, "isolation": False}

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.hooks: ServiceHooks | None = None
        self._root: Path | None = None
        self._records: dict[str, SandboxRecord] = {}
        self._volumes: dict[str, VolumeInfo] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    # start and stop ---------------------------------------------------------------------
    def bind(self, hooks: ServiceHooks) -> None:
        self.hooks = hooks

    @property
    def root(self) -> Path:
        """This backend's host-only directory (made on first use, removed at close)."""
        with self._guard:
            if self._root is None:
                if shutil.which("bwrap") is None:
                    raise RuntimeUnavailableError(
                        "the memory backend starts its sandboxes with bwrap: apt-get install "
                        "-y bubblewrap")
                self._root = Path(tempfile.mkdtemp(prefix="abx-memory-"))
            return self._root

    def close(self) -> None:
        for sandbox_id in list(self._procs):
            self._stop(sandbox_id)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def reaping(self) -> bool:
        return True

    def maintain(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"mode": "memory", "isolation": "none: a backend for tests and development",
                "root": str(self._root) if self._root else None}

    # records ------------------------------------------------------------------------------
    def _lock(self, sandbox_id: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(sandbox_id, threading.RLock())

    def record(self, sandbox_id: str) -> SandboxRecord:
        found = self._records.get(sandbox_id)
        if found is None or found.state not in VISIBLE:
            raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)")
        return found

    def records(self) -> list[SandboxRecord]:
        return list(self._records.values())

    def update(self, sandbox_id: str, **fields: Any) -> None:
        record = self.record(sandbox_id)
        for name, value in fields.items():
            setattr(record, name, value)

    def touch(self, sandbox_id: str) -> None:
        found = self._records.get(sandbox_id)
        if found is not None:
            found.last_used = time.time()

    # templates ----------------------------------------------------------------------------
    def template(self, name: str, *, creating: bool = False) -> Template:
        if name != BASE:
            raise NotFoundError(f"template {name!r} not found (the memory backend has only "
                                f"{BASE!r})")
        return _BASE

    def list_templates(self) -> list[TemplateInfo]:
        return [TemplateInfo(name=BASE, kind="base", description=_BASE.description)]

    def import_template(self, name: str, source: str, *, replace: bool = False,
                        **meta: Any) -> TemplateInfo:
        raise WrongStateError("the memory backend has only the base template")

    def build_template(self, name: str, *, index_url: str | None, force: bool,
                       progress: Callable[[str], None] | None) -> tuple[TemplateInfo, str]:
        raise WrongStateError("the memory backend has only the base template")

    def remove_template(self, name: str) -> None:
        raise WrongStateError("the memory backend has only the base template")

    def recipes(self) -> Any:
        raise WrongStateError("the memory backend has only the base template")

    def template_exists(self, name: str) -> bool:
        return any(t.name == name for t in self.list_templates())

    def template_info(self, tmpl: Template) -> TemplateInfo:
        return TemplateInfo(name=tmpl.name, kind=tmpl.kind)

    def capture_layer(self, sandbox_id: str, key: str) -> None:
        raise WrongStateError("the memory backend has only the base template")

    def prune_layers(self) -> tuple[int, int]:
        return 0, 0

    # creates ------------------------------------------------------------------------------
    def limit_caps(self) -> dict[str, tuple[float, str]]:
        return {"cpu": (os.cpu_count() or 1, "this host's CPUs")}

    def check_network(self, policy: NetworkPolicy) -> None:
        pass  # kept on the record; a memory sandbox has no network at all (enforced says)

    @contextlib.contextmanager
    def creating(self) -> Iterator[None]:
        yield

    def claim_pooled(self, record: SandboxRecord) -> str | None:
        return None

    def drain_pool(self) -> int:
        return 0

    def make(self, record: SandboxRecord, template: Template, *, new_volume: bool) -> None:
        volume = self.root / "volumes" / record.volume_id
        if new_volume:
            volume.mkdir(parents=True, mode=0o755)
            self._volumes[record.volume_id] = VolumeInfo(
                volume_id=record.volume_id, size_mb=int(record.limits.get("disk_mb", 0)),
                created_at=record.created_at, attached_to=record.id)
        else:
            kept = self._volumes.get(record.volume_id)
            if kept is None:
                raise NotFoundError(f"volume {record.volume_id!r} not found")
            if kept.attached_to:
                raise WrongStateError(f"volume {record.volume_id!r} is attached to sandbox "
                                      f"{kept.attached_to}")
            kept.attached_to = record.id
        self._records[record.id] = record
        try:
            self._start(record)
        except BaseException:
            self._records.pop(record.id, None)
            self._detach(record, delete=new_volume)
            raise
        record.state = SandboxState.RUNNING
        record.last_used = time.time()

    # lifecycle ----------------------------------------------------------------------------
    def pause(self, sandbox_id: str) -> None:
        with self._lock(sandbox_id):
            record = self.record(sandbox_id)
            if record.state == SandboxState.PAUSED:
                return
            if self._running(sandbox_id):
                GuestClient(self._socket(sandbox_id), io_timeout=10).freeze()
            record.state = SandboxState.PAUSED

    def resume(self, sandbox_id: str) -> None:
        self.guest(sandbox_id)

    def release(self, sandbox_id: str) -> None:
        with self._lock(sandbox_id):
            self._stop(sandbox_id)

    def reset_rootfs(self, sandbox_id: str) -> None:
        with self._lock(sandbox_id):
            record = self.record(sandbox_id)
            self._stop(sandbox_id)
            self._start(record)  # a new empty root: every change outside /workspace gone
            record.state = SandboxState.RUNNING

    def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        self.update(sandbox_id, network=policy)

    def kill(self, sandbox_id: str, *, delete_volume: bool) -> None:
        with self._lock(sandbox_id):
            record = self.record(sandbox_id)
            record.state = SandboxState.KILLING
            self._stop(sandbox_id)
            assert self.hooks is not None
            self.hooks.guest_gone(sandbox_id, keep_contexts=False)
            self._detach(record, delete=delete_volume)
            shutil.rmtree(self.sandbox_dir(sandbox_id), ignore_errors=True)
            self._records.pop(sandbox_id, None)

    def release_host(self) -> None:
        if any(r.state in VISIBLE for r in self._records.values()):
            raise WrongStateError("sandboxes still exist; kill them first")

    def leftovers(self) -> list[str]:
        return []

    # the guest ----------------------------------------------------------------------------
    def guest(self, sandbox_id: str, record: SandboxRecord | None = None) -> GuestClient:
        record = self.record(sandbox_id)
        if record.state == SandboxState.PAUSED or not self._running(sandbox_id):
            with self._lock(sandbox_id):
                if not self._running(sandbox_id):
                    self._start(record)  # released: booted again, without its processes
                elif record.state == SandboxState.PAUSED:
                    GuestClient(self._socket(sandbox_id), io_timeout=10).thaw()
                record.state = SandboxState.RUNNING
        self.touch(sandbox_id)
        return GuestClient(self._socket(sandbox_id))

    def client(self, sandbox_id: str) -> GuestClient:
        return GuestClient(self._socket(sandbox_id))

    def replace_guest(self, sandbox_id: str, failed: GuestClient) -> GuestClient | None:
        if self._running(sandbox_id):
            return None  # busy, not gone
        with self._lock(sandbox_id):
            self._start(self.record(sandbox_id))
        return self.client(sandbox_id)

    def stop_misbehaving(self, sandbox_id: str) -> None:
        with self._lock(sandbox_id):
            assert self.hooks is not None
            self.hooks.guest_gone(sandbox_id)
            self._stop(sandbox_id)

    def guest_env(self, record: SandboxRecord) -> dict[str, str]:
        return {}

    def kernel_files(self, host: KernelHost) -> KernelFiles:
        return KernelFiles(host)  # base has no kernel: never asked to write one

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.root / "sandboxes" / sandbox_id

    # volumes ----------------------------------------------------------------------------
    def volumes(self) -> list[VolumeInfo]:
        return [v.model_copy() for v in self._volumes.values()]

    def delete_volume(self, volume_id: str) -> None:
        found = self._volumes.get(volume_id)
        if found is None:
            raise NotFoundError(f"volume {volume_id!r} not found")
        if found.attached_to:
            raise WrongStateError(f"volume {volume_id} is attached to {found.attached_to}")
        shutil.rmtree(self.root / "volumes" / volume_id, ignore_errors=True)
        del self._volumes[volume_id]

    def disk_headroom(self) -> dict[str, int] | None:
        return None

    def usage(self, sandbox_id: str) -> Usage:
        raise RuntimeUnavailableError(
            "the memory backend runs sandboxes in no cgroup of their own: no metrics to read "
            "(the runc backend has them)")

    # processes ----------------------------------------------------------------------------
    def _socket(self, sandbox_id: str) -> str:
        """The guest's listener, bound by this process in the sandbox's host-only
        directory (never in its run dir, where the sandbox could plant a link)."""
        return str(self.sandbox_dir(sandbox_id) / _SOCKET)

    def _running(self, sandbox_id: str) -> bool:
        proc = self._procs.get(sandbox_id)
        return proc is not None and proc.poll() is None

    def _detach(self, record: SandboxRecord, *, delete: bool) -> None:
        kept = self._volumes.get(record.volume_id)
        if kept is None or kept.attached_to != record.id:
            return
        if delete:
            shutil.rmtree(self.root / "volumes" / record.volume_id, ignore_errors=True)
            del self._volumes[record.volume_id]
        else:
            kept.attached_to = ""

    def _stop(self, sandbox_id: str) -> None:
        proc = self._procs.pop(sandbox_id, None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _start(self, record: SandboxRecord) -> None:
        """The guest in a new bwrap over an empty root; returns once it answers."""
        sbdir = self.sandbox_dir(record.id)
        run, etc = sbdir / "run", sbdir / "etc"
        for folder in (run, etc):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(sbdir, 0o700)
        (etc / "passwd").write_text(_PASSWD)
        (etc / "group").write_text(_GROUP)
        (etc / "hostname").write_text(record.id + "\n")
        (etc / "hosts").write_text(f"127.0.0.1 localhost {record.id}\n")
        listener = guest_listener(self._socket(record.id))
        argv = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--as-pid-1", "--new-session",
                "--hostname", record.id, "--ro-bind", "/usr", "/usr",
                *(arg for name in ("bin", "lib", "lib64", "sbin")
                  for arg in ("--symlink", f"usr/{name}", f"/{name}")),
                "--ro-bind", str(etc), "/etc", "--proc", "/proc", "--dev", "/dev",
                "--tmpfs", "/tmp", "--dir", "/root", "--dir", "/home/user",
                "--bind", str(self.root / "volumes" / record.volume_id), "/workspace",
                "--bind", str(run), GUEST_RUN_DIR, "--ro-bind", str(GUEST_SOURCE), GUEST_DIR,
                "--setenv", "PATH", DEFAULT_PATH, "--chdir", "/",
                "/usr/bin/python3", "-I", "-S", "-X", "utf8", "-c", _BOOT,
                "--listen-fd", str(listener.fileno())]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin"}, pass_fds=(listener.fileno(),))
        finally:
            listener.close()  # the guest holds it now
        self._procs[record.id] = proc
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], _READY_TIMEOUT)
        line = os.read(proc.stdout.fileno(), 4096) if ready else b""
        proc.stdout.close()  # its later output goes nowhere
        if b"ready" not in line:
            self._stop(record.id)
            raise GuestUnavailableError(f"sandbox {record.id}'s guest did not start in the "
                                        f"memory backend: {line.decode(errors='replace')!r}")

