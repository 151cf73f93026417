"""The host's side of an account's kernel directory, on a plain directory (no root, no
sandbox): made new and confined, emptied without following anything planted in it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_sandbox.backends.runc.kernel_files import RunDirKernelFiles
from agent_sandbox.backends.runc.rootfs import confined
from agent_sandbox.service.code.files import KernelFiles, KernelState


class _Host:
    """Just where the files go (what KernelFiles asks of an engine)."""

    sandbox_owner = None

    def __init__(self, root: Path) -> None:
        self.root = root

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.root


@pytest.fixture
def files(tmp_path: Path) -> KernelFiles:
    (tmp_path / "run").mkdir(mode=0o700)
    return RunDirKernelFiles(_Host(tmp_path))  # type: ignore[arg-type]


def test_a_directory_can_be_opened_beneath(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    run = confined.open_dir(tmp_path)
    try:  # O_DIRECTORY shares a bit with O_TMPFILE: no mode may be passed for it
        os.close(confined.open_beneath(run, "sub", os.O_RDONLY | os.O_DIRECTORY))
    finally:
        os.close(run)


def test_an_accounts_connection_file_and_its_removal(files: KernelFiles,
                                                     tmp_path: Path) -> None:
    state = KernelState(context="ctx-1", cwd="/workspace", key="k" * 64, prefix="kabc",
                        user="user")
    assert state.inside == "/.abx/run/kabc.d/kernel.json"
    files.write_connection("sbx", state)
    run = tmp_path / "run"
    assert run.stat().st_mode & 0o777 == 0o711  # traversable, not listable
    own = run / "kabc.d"
    assert own.stat().st_mode & 0o777 == 0o700
    assert '"ip": "/.abx/run/kabc.d/k"' in (own / "kernel.json").read_text()
    with pytest.raises(FileExistsError):  # never an existing entry
        files.write_connection("sbx", state)

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("host")
    (own / "planted").symlink_to(victim / "keep")
    (own / "k-1").symlink_to(victim)
    files.remove("sbx", state)
    assert not own.exists() and (victim / "keep").read_text() == "host"

    # The directory replaced by a link: nothing is removed through it.
    own.symlink_to(victim)
    files.remove("sbx", state)
    assert (victim / "keep").read_text() == "host" and own.is_symlink()


def test_a_root_context_keeps_its_flat_layout(files: KernelFiles, tmp_path: Path) -> None:
    state = KernelState(context="default", cwd="/workspace", key="k" * 64, prefix="kdef")
    assert state.inside == "/.abx/run/kdef.json"
    files.write_connection("sbx", state)
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700  # untouched
    assert '"ip": "/.abx/run/kdef"' in (tmp_path / "run" / "kdef.json").read_text()
    files.remove("sbx", state)
    assert not list((tmp_path / "run").iterdir())
