"""After a crash: finish or roll back what a dead engine process left half done."""

from __future__ import annotations

import os

from agent_sandbox.backends.runc import checkpoint
from agent_sandbox.backends.runc.rootfs import overlay as rootfs
from agent_sandbox.backends.runc.sandbox_lock import LOCK_FILE, held_elsewhere
from agent_sandbox.backends.runc.sandboxes import (
    CREATE_LOCK,
    DUMPING,
    IMAGE,
    NEW_PREFIX,
    SNAPSHOTS,
    Sandboxes,
)
from agent_sandbox.core.states import SandboxState


def creator_gone(sandboxes: Sandboxes, sandbox_id: str) -> bool:
    return not held_elsewhere(sandboxes.sandbox_dir(sandbox_id) / CREATE_LOCK)


def recover(sandboxes: Sandboxes) -> None:
    """Half-made sandboxes, half-killed ones, orphan containers, mounts and dirs. Safe to
    run any number of times, by any number of processes (locks say who is alive)."""
    store, runc = sandboxes.store, sandboxes.runc
    # Volumes before rows: a create inserts its row before it claims a volume, so a claim
    # seen here whose sandbox is not in the later list belongs to nobody (older engines
    # claimed first and could die in between).
    volumes = store.list_volumes()
    rows = {r.id for r in store.list_sandboxes()}
    for volume in volumes:
        if volume.attached_to and volume.attached_to not in rows:
            store.release_volume(volume.id, volume.attached_to)
    for row in store.list_sandboxes():
        sandboxes.finish_abandoned(row)
    live = {r.id: r for r in store.list_sandboxes()}
    _checkpoints(sandboxes, set(live), runc.list_states())
    for container_id, status in runc.list_states().items():
        if container_id not in live:
            if store.get_sandbox(container_id) is None:  # not one made meanwhile
                runc.delete(container_id)
        elif status == "paused" and live[container_id].state == SandboxState.RUNNING:
            # Frozen under a "running" row (an older engine died mid-pause).
            store.update_sandbox(container_id, state=SandboxState.PAUSED)
    recover_snapshots(sandboxes)
    for sbdir in sandboxes.layout.config.sandboxes_dir.iterdir():
        if sbdir.name.startswith(NEW_PREFIX):  # a create that had not locked it yet
            if _owner_dead(sbdir.name):
                sandboxes.mode.remove_tree(sbdir)
            continue
        if sbdir.name not in live and creator_gone(sandboxes, sbdir.name) and \
                store.get_sandbox(sbdir.name) is None:
            rootfs.unmount_rootfs(sbdir)
            sandboxes.mode.remove_tree(sbdir)



def _checkpoints(sandboxes: Sandboxes, live: set[str], states: dict[str, str]) -> None:
    """A pause, resume or snapshot that died mid-checkpoint (its sandbox's lock free).

    A pause's whole image beside no container is the paused sandbox's (the dump finished
    before its rename). A container left by a dump cut short may hold a parked guest
    (unreachable): it is stopped, and the sandbox's next use boots it, files kept. An
    image beside a running container was restored already (dropped); a container a
    restore left half made is removed (the image stays: the sandbox is paused)."""
    for sandbox_id in live:
        sbdir = sandboxes.sandbox_dir(sandbox_id)
        new, image = sbdir / f"{IMAGE}.new", sandboxes.image_dir(sandbox_id)
        dumping = (sbdir / DUMPING).exists()
        if not (dumping or new.exists() or image.exists()) or \
                held_elsewhere(sbdir / LOCK_FILE):
            continue
        status = states.get(sandbox_id, "")
        if new.exists() and not status and (new / checkpoint.LISTENER).exists():
            sandboxes.mode.remove_tree(image)
            os.rename(new, image)
        elif dumping and status:
            sandboxes.runc.delete(sandbox_id)
            sandboxes.booter.stop_network(sandbox_id)
            sandboxes.store.update_sandbox(sandbox_id, state=SandboxState.PAUSED)
        elif status == "running" and image.exists():
            sandboxes.mode.remove_tree(image)
        elif status and status != "running" and image.exists():
            sandboxes.runc.delete(sandbox_id)
        sandboxes.mode.remove_tree(new)
        sandboxes.dumped(sandbox_id)


def recover_snapshots(sandboxes: Sandboxes) -> None:
    """Temporary directories of snapshot takes and deletes whose process is gone."""
    root = sandboxes.layout.config.data_dir / SNAPSHOTS
    if not root.is_dir():
        return
    for path in root.iterdir():
        if path.name.startswith(NEW_PREFIX) and _owner_dead(path.name):
            sandboxes.mode.remove_tree(path)


def _owner_dead(name: str) -> bool:
    """``.new-<sandbox id>-<pid>``: is the creating process gone?"""
    pid = name.rpartition("-")[2]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False
