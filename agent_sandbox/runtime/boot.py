"""Starting a sandbox's container: disk, root filesystem, bundle, runc, the guest's first
answer, and its network proxy."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

from agent_sandbox.errors import RuntimeUnavailableError, SandboxTimeoutError
from agent_sandbox.runtime import netproc, supervisor
from agent_sandbox.runtime.config import Limits
from agent_sandbox.runtime.disk import SYSTEM, WORKSPACE
from agent_sandbox.runtime.guest_client import GuestClient, GuestUnavailableError
from agent_sandbox.runtime.guest_python import GuestPython, host_python
from agent_sandbox.runtime.host_mode import HostMode
from agent_sandbox.runtime.oci import BundleSpec, build_config
from agent_sandbox.runtime.runc import Runc
from agent_sandbox.runtime.store import SandboxRow, Store

GUEST_DIR = Path(__file__).resolve().parent.parent / "guest"
_READY_TIMEOUT = 15.0
_GUEST_OUTPUT_KEPT = 8192  # of what a guest prints before it is ready, for error messages


class Booter:
    def __init__(self, mode: HostMode, runc: Runc, store: Store) -> None:
        self.mode = mode
        self.layout = mode.layout
        self.runc = runc
        self.store = store
        self._guest_python: GuestPython | None = None

    def boot(self, row: SandboxRow) -> None:
        """Mount disk and root filesystem, write the bundle, start the container."""
        supervisor.ensure_running(self.layout.config)  # its idle timeout outlives us
        sbdir = self.layout.sandbox_dir(row.id)
        disk_root = self.mode.attach(row)
        self.mode.sweep_trash(disk_root)  # a crashed reset's
        run_dir = sbdir / "run"
        run_dir.mkdir(mode=0o700, exist_ok=True)
        # The guest runs on the host's python from a read-only view of the host's /usr,
        # never on anything in the sandbox's writable layers.
        guest = self.guest_python()
        spec = BundleSpec(
            sandbox_id=row.id, rootfs=str(sbdir / "rootfs"),
            workspace=str(disk_root / WORKSPACE), run_dir=str(run_dir),
            guest_dir=str(GUEST_DIR), python=guest.argv, limits=Limits(**row.limits),
            extra_mounts=tuple(guest.mounts), empty_file=str(self.layout.empty_file()),
            resolv_file=str(self.layout.resolv_file()),
        )
        config = build_config(spec)
        config["process"]["env"] += [f"{k}={v}" for k, v in guest.env.items()]
        config = self.mode.bundle(row, config)
        (sbdir / "config.json").write_text(json.dumps(config))
        listener = _listen(self.layout.socket(row.id))
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                self.runc.run_detached(row.id, sbdir, listener.fileno(), out_w)
            finally:
                os.close(out_w)
                listener.close()  # the guest holds it now; dies with the container
            self.wait_ready(row.id, out_r)
        finally:
            os.close(out_r)  # the guest's later output goes nowhere
        if row.network.mode != "off":
            self.start_network(row)

    def system_dir(self, row: SandboxRow) -> Path:
        return self.mode.disk_root(row) / SYSTEM

    def guest_python(self) -> GuestPython:
        if self._guest_python is None:
            self._guest_python = host_python()
        return self._guest_python

    def wait_ready(self, sandbox_id: str, output: int) -> None:
        """Until the guest answers a ping. The listener exists before the guest runs,
        so a connection waits in its backlog (no polling for a file); a refused one
        means the guest is gone. What the guest printed meanwhile (read from a pipe,
        bounded) explains a failure."""
        deadline = time.monotonic() + _READY_TIMEOUT
        client = GuestClient(self.layout.socket(sandbox_id), connect_timeout=1.0)
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

    # network ----------------------------------------------------------------------------
    def start_network(self, row: SandboxRow) -> None:
        """The policy proxy of this boot's network namespace (none with the network off);
        whatever served an earlier boot serves a namespace that is gone."""
        self.stop_network(row.id)
        if row.network.mode == "off":
            return
        state = self.runc.state(row.id)
        if not state:
            raise RuntimeUnavailableError(f"sandbox {row.id} has no running container to "
                                          "give a network")
        pid = netproc.start(self.layout.sandbox_dir(row.id), state["pid"], row.network,
                            self.layout.config, join_userns=self.mode.join_userns)
        self.store.update_sandbox(row.id, helper_pid=pid)

    def stop_network(self, sandbox_id: str) -> None:
        row = self.store.get_sandbox(sandbox_id)
        if row is not None and row.helper_pid:
            netproc.stop(row.helper_pid)
            self.store.update_sandbox(sandbox_id, helper_pid=0)


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
