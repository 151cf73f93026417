"""Starting a sandbox's container: disk, root filesystem, bundle, runc, the guest's first
answer, and its network proxy."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from agent_sandbox.backends.runc import checkpoint, supervisor
from agent_sandbox.backends.runc.host.guest_python import GuestPython, host_python
from agent_sandbox.backends.runc.host.mode import HostMode
from agent_sandbox.backends.runc.netproxy import launch as netproc
from agent_sandbox.backends.runc.oci.bundle import BundleSpec, build_config
from agent_sandbox.backends.runc.rootfs.disk import SYSTEM
from agent_sandbox.backends.runc.runc import Runc
from agent_sandbox.backends.runc.store import Store
from agent_sandbox.config.engine import Limits
from agent_sandbox.core.errors import RuntimeUnavailableError, SandboxTimeoutError
from agent_sandbox.guest import SOURCE_DIR
from agent_sandbox.guestlink.channel import guest_listener
from agent_sandbox.guestlink.client import GuestClient, GuestUnavailableError
from agent_sandbox.service.record import SandboxRecord
from agent_sandbox.service.secrets import SANDBOX_CA_PATH, SecretStore

_READY_TIMEOUT = 15.0
_GUEST_OUTPUT_KEPT = 8192  # of what a guest prints before it is ready, for error messages


class Booter:
    def __init__(self, mode: HostMode, runc: Runc, store: Store) -> None:
        self.mode = mode
        self.layout = mode.layout
        self.runc = runc
        self.store = store
        self._guest_python: GuestPython | None = None
        self.secrets = SecretStore.of(self.layout.config.data_dir)

    def boot(self, row: SandboxRecord) -> None:
        """Mount disk and root filesystem, write the bundle, start the container."""
        supervisor.ensure_running(self.layout.config)  # its idle timeout outlives us
        sbdir = self.write_bundle(row)
        listener = guest_listener(self.layout.socket(row.id))
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

    def write_bundle(self, row: SandboxRecord) -> Path:
        """Mount disk and root filesystem and write the OCI bundle; its directory."""
        sbdir = self.layout.sandbox_dir(row.id)
        disk_root = self.mode.attach(row)
        self.mode.sweep_trash(disk_root)  # a crashed reset's
        workspace = self.mode.workspace(row)
        run_dir = sbdir / "run"
        run_dir.mkdir(mode=0o700, exist_ok=True)
        # The guest runs on the host's python from a read-only view of the host's /usr,
        # never on anything in the sandbox's writable layers.
        guest = self.guest_python()
        shared = self.mode.shared_files(SOURCE_DIR)
        mounts = tuple(guest.mounts)
        ca_bundle = self.secrets.ca_bundle(row.id)
        if ca_bundle.exists():  # its own CA's certificate, host-owned, read-only
            mounts += ({"destination": SANDBOX_CA_PATH, "type": "bind",
                        "source": str(ca_bundle), "options": ["rbind", "nosuid", "nodev",
                                                              "noexec", "ro"]},)
        spec = BundleSpec(
            sandbox_id=row.id, rootfs=str(sbdir / "rootfs"),
            workspace=str(workspace), run_dir=str(run_dir),
            guest_dir=shared.guest_dir, python=guest.argv, limits=Limits(**row.limits),
            extra_mounts=mounts, empty_file=shared.empty_file,
            resolv_file=shared.resolv_file,
        )
        config = build_config(spec)
        config["process"]["env"] += [f"{k}={v}" for k, v in guest.env.items()]
        config = self.mode.bundle(row, config)
        (sbdir / "config.json").write_text(json.dumps(config))
        return sbdir

    def restore(self, row: SandboxRecord, image_dir: Path, *, fresh_bundle: bool) -> None:
        """Start the sandbox's container from a checkpoint image instead of booting it:
        disk and root filesystem mounted (again, after a host restart; ``fresh_bundle``:
        a new sandbox's, a fork), a new listener for the guest, its network proxy."""
        supervisor.ensure_running(self.layout.config)
        sbdir = self.layout.sandbox_dir(row.id)
        if fresh_bundle or not (sbdir / "config.json").exists():
            self.write_bundle(row)
        else:
            self.mode.workspace(row)  # disk attached, a shared workspace mounted
            self.mode.bundle(row, json.loads((sbdir / "config.json").read_text()))  # mounts
        work = sbdir / "criu"  # this restore's logs: an image may be restored many times
        self.mode.remove_tree(work)
        work.mkdir(mode=0o700, exist_ok=True)
        listener = guest_listener(self.layout.socket(row.id))
        try:
            checkpoint.restore(self.runc, row.id, sbdir, image_dir, work, listener.fileno(),
                               [layer["target"] for layer in row.layers])
        finally:
            listener.close()  # the guest holds it now
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        os.close(out_w)  # a restored guest prints nothing: wait_ready reads an empty pipe
        try:
            self.wait_ready(row.id, out_r)
        finally:
            os.close(out_r)
        if fresh_bundle:  # a copy: its own name, not its snapshot's
            self.set_hostname(row.id)
        if row.network.mode != "off":
            self.start_network(row)

    def set_hostname(self, sandbox_id: str) -> None:
        """The UTS namespace a restore brought back renamed to this sandbox's id (the
        host's own nsenter and hostname, in the host's mount namespace)."""
        state = self.runc.state(sandbox_id)
        if not state:
            raise RuntimeUnavailableError(f"sandbox {sandbox_id} has no running container")
        done = subprocess.run(["nsenter", "-t", str(int(state["pid"])), "--uts", "hostname",
                               sandbox_id], capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise RuntimeUnavailableError(f"could not name sandbox {sandbox_id}: "
                                          f"{done.stderr.strip()[-300:]}")

    def system_dir(self, row: SandboxRecord) -> Path:
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
    def start_network(self, row: SandboxRecord) -> None:
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
                            self.layout.config, join_userns=self.mode.join_userns,
                            secrets=self.secrets.material(row.id))
        self.store.update_sandbox(row.id, helper_pid=pid)

    def stop_network(self, sandbox_id: str) -> None:
        row = self.store.get_sandbox(sandbox_id)
        if row is not None and row.helper_pid:
            netproc.stop(row.helper_pid)
            self.store.update_sandbox(sandbox_id, helper_pid=0)



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
