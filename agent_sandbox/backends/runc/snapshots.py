"""Snapshots of sandboxes on this host, and sandboxes started from them (forks).

A snapshot is a directory of the data dir's ``snapshots/`` (root:sandboxes' group 0710,
like the sandboxes' directories; nothing in it is visible to any sandbox):

    meta.json   what it is and the record of the sandbox it was taken of (host-written)
    image/      the CRIU checkpoint (memory and processes), read by restores only
    files/      the sandbox's system layer (sys/) and /workspace (workspace/), copied while
                its container was stopped for the checkpoint: consistent with the memory

It is made under ``.new-<id>-<pid>`` and renamed into place when whole, so a crash leaves
either a whole snapshot or a temporary directory that ``recovery`` removes. A fork
is a create whose container starts by a restore of the image; its files are not copied:
the snapshot's system layer is a read-only lower of each of its overlays (``SHARED``), and
its /workspace an overlay over the snapshot's copy, whose changes are on the fork's disk
(``share_workspace``). A deleted snapshot disappears at once (its meta.json becomes
deleted.json, its image goes); its files stay while a sandbox, a kept volume or another
snapshot still reads them, and ``collect`` removes them after.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent_sandbox.backends.runc import checkpoint
from agent_sandbox.backends.runc.rootfs.disk import SYSTEM, WORKSPACE, check_free
from agent_sandbox.backends.runc.rootfs.overlay import SHARED
from agent_sandbox.backends.runc.sandboxes import NEW_PREFIX, SNAPSHOTS, Sandboxes
from agent_sandbox.core import validate
from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError
from agent_sandbox.core.models import SnapshotInfo
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service.record import SandboxRecord

META = "meta.json"
DELETED = "deleted.json"  # a deleted snapshot's meta.json, while its files are in use
LOCK = ".lock"  # in the snapshots' folder: forks starting (shared) and deletes (exclusive)
IMAGE = "image"
FILES = "files"
_COPY_TIMEOUT = 600.0


class RuncSnapshots:
    def __init__(self, parts: Sandboxes) -> None:
        self.parts = parts
        self.root = parts.layout.config.data_dir / SNAPSHOTS

    def _dir(self) -> Path:
        if not self.root.is_dir():
            self.root.mkdir(exist_ok=True)
            self.parts.mode.private_dir(self.root)  # restores in user namespaces traverse it
        return self.root

    # taking one -------------------------------------------------------------------------
    def take(self, sandbox_id: str, snapshot_id: str, name: str, owner: str) -> SnapshotInfo:
        parts = self.parts
        if not parts.keeps_memory():
            checkpoint.criu_binary()  # its error names the fix
            raise RuntimeUnavailableError("memory snapshots need the root engine")
        with parts.lock(sandbox_id):
            row = parts.row(sandbox_id)
            new = self._dir() / f"{NEW_PREFIX}{snapshot_id}-{os.getpid()}"
            new.mkdir(mode=0o700)
            parts.mode.private_dir(new)
            try:
                self._capture(row, new)
                info = SnapshotInfo(snapshot_id=snapshot_id, name=name, sandbox_id=row.id,
                                    template=row.template, created_at=time.time(),
                                    size_bytes=_size(new), owner=owner)
                _write_meta(new / META, info, row)
                os.rename(new, self.root / snapshot_id)
            except BaseException:
                parts.mode.remove_tree(new)
                raise
            return info

    def _capture(self, row: SandboxRecord, into: Path) -> None:
        """Image and files of ``row`` into ``into``; the sandbox is as it was after."""
        parts = self.parts
        image = into / IMAGE
        paused = parts.image_dir(row.id)
        if row.state == SandboxState.PAUSED and (paused / checkpoint.LISTENER).exists():
            _copy_tree(paused, image)  # checkpointed already: its container is stopped
            self._copy_files(row, into / FILES)
            return
        status = parts.ensure_container(row)
        parts.mode.thaw(parts.runc, row, status, parts.control(row.id))  # a frozen one
        checkpoint.fresh_image_dir(image)
        parts.dump(row, image, "snapshotted")
        try:
            self._copy_files(row, into / FILES)
        finally:
            try:
                self._restart(row, image)
            finally:
                parts.dumped(row.id)

    def _restart(self, row: SandboxRecord, image: Path) -> None:
        """The snapshotted sandbox runs again from the image just taken; if it cannot, it
        is left cleanly paused on a copy of it."""
        parts = self.parts
        try:
            parts.booter.restore(row, image, fresh_bundle=False)
        except BaseException:
            parts.runc.delete(row.id)
            _copy_tree(image, parts.image_dir(row.id))
            parts.store.update_sandbox(row.id, state=SandboxState.PAUSED)
            raise
        if row.state == SandboxState.PAUSED:
            parts.store.update_sandbox(row.id, state=SandboxState.RUNNING)

    def _copy_files(self, row: SandboxRecord, into: Path) -> None:
        """Its own system layer (a fork's lowers stay its snapshot's: in the record) and
        all of /workspace (a fork's: with its snapshot's, as the sandbox sees it)."""
        disk_root = self.parts.mode.attach(row)  # mounted still, or again after a reboot
        workspace = self.parts.mode.workspace(row)
        # As much as its disk holds, never out of the host's reserve.
        used = os.statvfs(disk_root)
        check_free(into.parent, self.parts.layout.config.host_reserve_mb,
                   (used.f_blocks - used.f_bfree) * used.f_frsize >> 20, "a snapshot's files")
        into.mkdir(mode=0o700)
        _copy_tree(disk_root / SYSTEM, into / SYSTEM)
        _copy_tree(workspace, into / WORKSPACE)

    # listing ------------------------------------------------------------------------------
    def list(self) -> list[SnapshotInfo]:
        if not self.root.is_dir():
            return []
        out = []
        for path in self.root.iterdir():
            if path.name.startswith(NEW_PREFIX):
                continue
            try:
                out.append(_read_meta(path / META)[0])
            except (OSError, ValueError, KeyError):
                continue  # removed meanwhile
        return out

    def source(self, snapshot_id: str) -> tuple[SnapshotInfo, SandboxRecord]:
        validate.snapshot_id(snapshot_id)
        try:
            return _read_meta(self.root / snapshot_id / META)
        except (OSError, ValueError, KeyError):
            raise NotFoundError(f"snapshot {snapshot_id} not found (it may have been "
                                "deleted; list_snapshots shows them)") from None

    def delete(self, snapshot_id: str) -> None:
        self.source(snapshot_id)
        snap = self.root / snapshot_id
        with _locked(self._dir() / LOCK, fcntl.LOCK_EX):  # no fork starting from it
            try:
                os.rename(snap / META, snap / DELETED)  # at once invisible
            except FileNotFoundError:
                raise NotFoundError(f"snapshot {snapshot_id} not found") from None
            self.parts.mode.remove_tree(snap / IMAGE)  # forks read it only as they start
        self.collect()

    def collect(self) -> None:
        """Remove the files of deleted snapshots that nothing reads any more: no sandbox's
        layers, no volume's workspace, no other snapshot's record names them. Skipped
        while a fork is starting (the next call does it)."""
        if not self.root.is_dir():
            return
        with _locked(self.root / LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
            while held:
                used = self._in_use()
                unused = [p for p in self.root.iterdir()
                          if (p / DELETED).exists() and p.name not in used]
                if not unused:
                    return
                for path in unused:  # out of sight first: a crash leaves a temp dir
                    gone = self.root / f"{NEW_PREFIX}{path.name}-gone-{os.getpid()}"
                    os.rename(path, gone)
                    self.parts.mode.remove_tree(gone)

    def _in_use(self) -> set[str]:
        """Ids of the snapshots whose files something reads."""
        paths = [p for row in self.parts.store.list_sandboxes() for layer in row.layers
                 for p in layer.get(SHARED, ())]
        paths += self.parts.mode.shared_workspaces().values()
        for snap in self.root.iterdir():
            for record in (snap / META, snap / DELETED):
                try:
                    parent = _read_meta(record)[1]
                except (OSError, ValueError, KeyError):
                    continue
                paths += [p for layer in parent.layers for p in layer.get(SHARED, ())]
        used = set()
        for path in paths:
            parts = Path(path).parts
            top = self.root.parts
            if parts[:len(top)] == top and len(parts) > len(top):
                used.add(parts[len(top)])
        return used

    # forks ------------------------------------------------------------------------------
    def make_from(self, record: SandboxRecord, snapshot_id: str) -> None:
        checkpoint.criu_binary()
        # Held until the fork's record and volume name the snapshot's files: no delete
        # (nor collect) meanwhile; any number of forks at once.
        with _locked(self._dir() / LOCK, fcntl.LOCK_SH) as held:
            assert held
            self._make_from(record, snapshot_id)

    def _make_from(self, record: SandboxRecord, snapshot_id: str) -> None:
        self.source(snapshot_id)
        snap = self.root / snapshot_id
        files = snap / FILES
        for index, layer in enumerate(record.layers):
            upper = files / SYSTEM / "upper" / str(index)
            if upper.is_dir():
                layer[SHARED] = [str(upper), *layer.get(SHARED, ())]

        def start(row: SandboxRecord) -> None:
            self.parts.mode.share_workspace(row.volume_id, files / WORKSPACE)
            self.parts.booter.restore(row, snap / IMAGE, fresh_bundle=True)

        self.parts.make(record, new_volume=True, final_state=SandboxState.RUNNING,
                        start=start)


@contextmanager
def _locked(path: Path, how: int) -> Iterator[bool]:
    """flock ``how`` on ``path``; False (not held) when LOCK_NB and someone holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases it


def _write_meta(path: Path, info: SnapshotInfo, row: SandboxRecord) -> None:
    parent = asdict(row)
    parent["network"] = row.network.model_dump()
    parent["state"] = str(row.state)
    text = json.dumps({"info": info.model_dump(), "parent": parent})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_meta(path: Path) -> tuple[SnapshotInfo, SandboxRecord]:
    """A snapshot's own record: host-written, in a host-only directory."""
    data: dict[str, Any] = json.loads(path.read_text())
    parent = dict(data["parent"])
    parent["network"] = NetworkPolicy.model_validate(parent["network"])
    parent["state"] = SandboxState(parent["state"])
    return SnapshotInfo.model_validate(data["info"]), SandboxRecord(**parent)


def _copy_tree(src: Path, dst: Path) -> None:
    """A copy of a tree (owners, modes, xattrs, links as links), blocks shared where the
    filesystem can. The source is a stopped sandbox's, so nothing changes it meanwhile;
    cp never follows a link in it (-a implies -P)."""
    _cp(["cp", "-a", "--reflink=auto", "--sparse=always", "--", str(src), str(dst)])


def _cp(argv: list[str]) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_COPY_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RuntimeUnavailableError(f"copying a snapshot's files took over "
                                      f"{_COPY_TIMEOUT:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeUnavailableError(f"copying a snapshot's files failed: "
                                      f"{proc.stderr.strip()[-500:]}")


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total

