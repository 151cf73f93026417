"""Sandbox disks: the cached blank image the engine copies for every new disk."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from agent_sandbox.backends.runc.rootfs import disk


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


def test_blanks_of_many_sizes_do_not_pile_up(tmp_path: Path) -> None:
    # Each distinct disk_mb makes a blank; a client asking a new size each time must not
    # fill the host with them: the least recently used are removed.
    images = tmp_path / "volumes"
    images.mkdir()
    for size in range(16, 16 + disk._KEPT_BLANKS + 4):  # noqa: SLF001
        disk.create_image(images / f"{size}.img", size, tmp_path / "blank", reserve_mb=0)
    kept = sorted(p.name for p in (tmp_path / "blank").glob("blank-*.img"))
    assert len(kept) == disk._KEPT_BLANKS  # noqa: SLF001
    assert "blank-16m.img" not in kept and f"blank-{size}m.img" in kept
    again = images / "16-again.img"
    disk.create_image(again, 16, tmp_path / "blank", reserve_mb=0)  # made anew
    assert subprocess.run(["e2fsck", "-fn", str(again)], capture_output=True).returncode == 0


def test_a_blank_evicted_by_another_process_is_made_again(tmp_path: Path) -> None:
    images = tmp_path / "volumes"
    images.mkdir()
    disk.create_image(images / "a.img", 16, tmp_path / "blank", reserve_mb=0)
    (tmp_path / "blank" / "blank-16m.img").unlink()  # what another engine's eviction does
    disk.create_image(images / "b.img", 16, tmp_path / "blank", reserve_mb=0)
    assert subprocess.run(["e2fsck", "-fn", str(images / "b.img")],
                          capture_output=True).returncode == 0


def test_half_made_blanks_of_dead_processes_are_swept(tmp_path: Path) -> None:
    cache = tmp_path / "blank"
    cache.mkdir()
    dead = cache / "blank-16m.img.999999999.abcd.tmp"
    live = cache / f"blank-16m.img.{os.getpid()}.abcd.tmp"
    for path in (dead, live):
        path.write_bytes(b"x")
    disk._formatted_blank(cache, 20)  # noqa: SLF001 - making any blank sweeps
    assert not dead.exists() and live.exists()
