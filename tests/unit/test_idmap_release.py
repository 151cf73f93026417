"""Releasing the idmapped views of a data dir that is gone leaves nothing behind."""

from pathlib import Path

from agent_sandbox.backends.runc.rootfs.overlay import IdmapViews


def test_release_and_forget_of_a_removed_data_dir_make_no_directory(tmp_path: Path) -> None:
    views = IdmapViews(tmp_path / "data" / "idmap")  # the data dir was removed meanwhile
    assert views.release() is True
    views.forget(["/var/lib/agent-sandbox-templates/base"])
    assert not (tmp_path / "data").exists()  # was recreated with idmap/.lock, then left
