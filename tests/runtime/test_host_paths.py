"""The data dir check the engine runs at its start and ``abx doctor`` runs too
(backends/runc/host_paths.py): a directory the sandboxes' root cannot enter, or a data dir that
cannot be made, is named with its fix, and the engine refuses before making anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.backends.runc.host_paths import data_dir_problem
from agent_sandbox.config.engine import HOST_ID_BASE, EngineConfig
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.providers.local import embedded_service

pytestmark = pytest.mark.integration  # root: chown, mounts


@pytest.fixture
def top() -> Iterator[Path]:
    # Not under pytest's tmp dir: that is 0700, which is what is tested here.
    top = Path(tempfile.mkdtemp(prefix="abx-paths-", dir="/var/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top)


def test_a_directory_the_sandboxes_root_cannot_enter_is_named(top: Path) -> None:
    private = top / "private"
    private.mkdir(mode=0o700)
    problem = data_dir_problem(private / "a" / "abx", HOST_ID_BASE)
    assert problem is not None
    assert f"cannot enter {private} (drwx------, owner 0:0), above the data dir" \
        in problem.what
    assert problem.fix.startswith(f"chmod o+x {private}; or choose another data dir")
    os.symlink(private, top / "link")  # judged where it leads
    linked = data_dir_problem(top / "link" / "abx", HOST_ID_BASE)
    assert linked is not None and linked.fix.startswith(f"chmod o+x {private};")
    assert data_dir_problem(private / "abx", None) is None  # rootless: its own user's
    # Whoever the bits are for: the sandboxes' root as owner, as group, as others.
    for uid, gid, mode, fix in ((HOST_ID_BASE, 0, 0o600, "u+x"), (0, HOST_ID_BASE, 0o700,
                                                                  "g+x"), (0, 0, 0o750, "o+x")):
        os.chown(private, uid, gid)
        private.chmod(mode)
        problem = data_dir_problem(private / "abx", HOST_ID_BASE)
        assert problem is not None and problem.fix.startswith(f"chmod {fix} {private};")
        private.chmod(mode | 0o111)
        assert data_dir_problem(private / "abx", HOST_ID_BASE) is None
    os.chown(private, HOST_ID_BASE + 5, HOST_ID_BASE + 5)  # the sandboxes' own ids
    private.chmod(0o700)
    assert data_dir_problem(private / "abx", HOST_ID_BASE) is None


def test_a_data_dir_that_cannot_be_made_is_named(top: Path) -> None:
    (top / "file").write_text("x")
    readonly = top / "ro"
    readonly.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(readonly)],
                   check=True)
    try:
        cases = {Path("/proc/x"): "the data dir /proc/x cannot be made: /proc takes no new "
                                  "directory",
                 top / "file" / "abx": f"{top / 'file'} is not a directory",
                 readonly / "abx": f"{readonly} takes no new directory (Read-only file "
                                   "system)",
                 readonly: f"the data dir {readonly} is not writable"}
        for data, what in cases.items():
            problem = data_dir_problem(data, HOST_ID_BASE)
            assert problem is not None and what in problem.what, (data, problem)
            assert problem.fix.startswith("choose another data dir"), problem
    finally:
        subprocess.run(["umount", str(readonly)], check=True)
    assert sorted(os.listdir(top)) == ["file", "ro"]  # the probes left nothing


def test_the_engine_refuses_before_making_anything(top: Path) -> None:
    private = top / "private"
    private.mkdir(mode=0o700)
    engine = embedded_service(EngineConfig(data_dir=private / "a" / "abx", pool_size=0),
                              reaper=False)
    try:
        with pytest.raises(RuntimeUnavailableError, match=rf"Fix: chmod o\+x {private};"):
            engine.list()
    finally:
        engine.close()
    assert os.listdir(private) == []
