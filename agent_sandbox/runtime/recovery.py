"""After a crash: finish or roll back what a dead engine process left half done."""

from __future__ import annotations

from agent_sandbox.runtime import rootfs
from agent_sandbox.runtime.sandbox_lock import LOCK_FILE, held_elsewhere
from agent_sandbox.runtime.sandboxes import Sandboxes
from agent_sandbox.runtime.store import CREATING, KILLING, KILLING_VOLUME, PAUSED, RUNNING


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
        if row.state == CREATING and creator_gone(sandboxes, row.id):
            sandboxes.destroy(row, delete_volume=row.volume_id == f"vol-{row.id[4:]}")
        elif row.state in (KILLING, KILLING_VOLUME) and \
                not held_elsewhere(sandboxes.sandbox_dir(row.id) / LOCK_FILE):
            sandboxes.destroy(row, delete_volume=row.state == KILLING_VOLUME)
    live = {r.id: r for r in store.list_sandboxes()}
    for container_id, status in runc.list_states().items():
        if container_id not in live:
            runc.delete(container_id)
        elif status == "paused" and live[container_id].state == RUNNING:
            # Frozen under a "running" row (an older engine died mid-pause).
            store.update_sandbox(container_id, state=PAUSED)
    for sbdir in sandboxes.layout.config.sandboxes_dir.iterdir():
        if sbdir.name not in live and creator_gone(sandboxes, sbdir.name):
            rootfs.unmount_rootfs(sbdir)
            sandboxes.mode.remove_tree(sbdir)
