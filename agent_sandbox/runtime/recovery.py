"""After a crash: finish or roll back what a dead engine process left half done."""

from __future__ import annotations

import os

from agent_sandbox.runtime import rootfs
from agent_sandbox.runtime.sandbox_lock import LOCK_FILE, held_elsewhere
from agent_sandbox.runtime.sandboxes import NEW_PREFIX, Sandboxes
from agent_sandbox.runtime.store import SandboxState


def creator_gone(sandboxes: Sandboxes, sandbox_id: str) -> bool:
    return not held_elsewhere(sandboxes.sandbox_dir(sandbox_id) / "create.lock")


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
        if row.state == SandboxState.CREATING and creator_gone(sandboxes, row.id):
            sandboxes.destroy(row, delete_volume=row.volume_id == f"vol-{row.id[4:]}")
        elif row.state in (SandboxState.KILLING, SandboxState.KILLING_VOLUME) and \
                not held_elsewhere(sandboxes.sandbox_dir(row.id) / LOCK_FILE):
            sandboxes.destroy(row, delete_volume=row.state == SandboxState.KILLING_VOLUME)
    live = {r.id: r for r in store.list_sandboxes()}
    for container_id, status in runc.list_states().items():
        if container_id not in live:
            if store.get_sandbox(container_id) is None:  # not one made meanwhile
                runc.delete(container_id)
        elif status == "paused" and live[container_id].state == SandboxState.RUNNING:
            # Frozen under a "running" row (an older engine died mid-pause).
            store.update_sandbox(container_id, state=SandboxState.PAUSED)
    for sbdir in sandboxes.layout.config.sandboxes_dir.iterdir():
        if sbdir.name.startswith(NEW_PREFIX):  # a create that had not locked it yet
            if _owner_dead(sbdir.name):
                sandboxes.mode.remove_tree(sbdir)
            continue
        if sbdir.name not in live and creator_gone(sandboxes, sbdir.name) and \
                store.get_sandbox(sbdir.name) is None:
            rootfs.unmount_rootfs(sbdir)
            sandboxes.mode.remove_tree(sbdir)



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
