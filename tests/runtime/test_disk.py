"""Sandbox disks: the cached blank image the engine copies for every new disk."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from agent_sandbox.runtime import disk


def test_blank_image_made_by_racing_threads_is_sound(tmp_path: Path) -> None:
    # A create and the warm pool's refill make the first blank at once; a shared temp
    # name once let one truncate the other's image mid-mkfs, caching a corrupt blank.
    start = threading.Barrier(4)
    made: list[Path] = []

    def make() -> None:
        start.wait()
        made.append(disk._formatted_blank(tmp_path, 64))  # noqa: SLF001

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 4 and len(set(made)) == 1
    check = subprocess.run(["e2fsck", "-fn", str(made[0])], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert [p.name for p in tmp_path.iterdir()] == [made[0].name]  # no temp files left


def test_a_corrupt_cached_blank_is_made_again(tmp_path: Path) -> None:
    bad = tmp_path / "blank-64m.img"
    bad.write_bytes(b"\0" * 4096 + b"not an ext4 superblock" * 100)
    blank = disk._formatted_blank(tmp_path, 64)  # noqa: SLF001
    assert blank == bad
    assert subprocess.run(["e2fsck", "-fn", str(blank)], capture_output=True).returncode == 0
