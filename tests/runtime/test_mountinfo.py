"""What a sandbox learns of the host's layout from its mount table: nothing.

Overlay options, bind roots and a loop device's backing file used to name the engine's
data dir and the checkout (``/proc/self/mountinfo``, ``/proc/mounts``, ``mount``): the
layers are now given to overlay as descriptors, the host files every sandbox binds come
from a stage tmpfs, and disk images are opened through a detached mount.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.backends.runc.host.guest_python import GUEST_EXE
from agent_sandbox.backends.runc.rootfs import overlay as rootfs
from agent_sandbox.backends.runc.stage import Stage
from agent_sandbox.config.settings import Settings

pytestmark = pytest.mark.integration

PACKAGE = Path(__file__).resolve().parents[2] / "agent_sandbox"
GUEST_DIR = PACKAGE / "guest"
# Everything the sandbox can read about its mounts, and its disk's backing file.
_SHOW = ("cat /proc/self/mountinfo /proc/self/mounts /proc/mounts; mount; "
         "cat /sys/dev/block/$(awk '$5 == \"/workspace\" {print $3}' /proc/self/mountinfo)"
         "/loop/backing_file")


def _host_names() -> list[str]:
    data = os.environ["ABX_DATA_DIR"]
    return sorted({data, os.path.realpath(data), str(PACKAGE), str(PACKAGE.parent),
                   str(Settings().shared_templates_dir), str(Path.home()), "/root", "/work",
                   os.path.realpath(Path.home())})


def _leaks(text: str) -> list[str]:
    """Lines naming a host directory (as a whole path component: /workspace is not /work)."""
    found = []
    for name in _host_names():
        pattern = re.compile(re.escape(name) + r"(?=[/\s:,]|$)")
        found += [f"{name!r} in: {line}" for line in text.splitlines() if pattern.search(line)]
    return found


def _check(sb: Sandbox) -> None:
    res = sb.commands.run(_SHOW, timeout=30)
    assert res.exit_code == 0, res
    text = res.stdout
    assert " / " in text and " on /workspace type ext4 " in text, text  # not vacuous
    guest = [ln.split() for ln in text.splitlines() if ln.split()[4:5] == ["/.abx/guest"]]
    assert guest and guest[0][3].startswith("/guest-"), text
    assert not _leaks(text), "\n".join(_leaks(text))


def test_base_sandbox_on_a_kept_volume() -> None:
    first = Sandbox.create()
    first.files.write("/workspace/kept", "yes")
    first.kill()  # the volume is kept
    with Sandbox.create(volume=first.volume_id) as sb:
        assert sb.files.read("/workspace/kept") == "yes"
        _check(sb)
        sb.reset_rootfs()  # mounted again: still nothing
        _check(sb)


def test_code_interpreter_sandbox(code_template: str) -> None:
    with Sandbox.create(template=code_template) as sb:
        assert sb.run_code("6 * 7").text == "42"  # its kernel's files in the run dir
        _check(sb)


def test_networked_sandbox() -> None:
    with Sandbox.create(network="registries") as sb:
        _check(sb)


def test_stage_copies_the_guest_once_per_content() -> None:
    """The stage holds an exact copy of the guest (times kept, so its bytecode stays
    valid), reuses it, makes a new one when the code changes, and unmounts cleanly."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        guest = Path(tmp) / "guest"
        (guest / "__pycache__").mkdir(parents=True)
        (guest / "agent.py").write_text("X = 1\n")
        (guest / "__pycache__" / "agent.cpython-39.pyc").write_bytes(b"\0" * 16)
        os.symlink("/etc/shadow", guest / "link.py")  # never copied, never followed
        os.utime(guest / "agent.py", ns=(1, 123_456_789_000))
        root = Path(tmp) / "stage"
        lock = Path(tmp) / ".lock"
        try:
            files = Stage(root, lambda: rootfs.file_lock(lock)).files(guest)
            assert os.path.ismount(root)
            copy = Path(files.guest_dir)
            # Plus the bytecode of the Python the guest runs on, readable by every sandbox.
            tag = subprocess.run([GUEST_EXE, "-c", "import sys; print(sys.implementation."
                                  "cache_tag)"], capture_output=True, text=True).stdout.strip()
            assert {p.relative_to(copy).as_posix() for p in copy.rglob("*")} == {
                "__pycache__", "__pycache__/agent.cpython-39.pyc",
                f"__pycache__/agent.{tag}.pyc", "agent.py"}
            assert (copy / "__pycache__" / f"agent.{tag}.pyc").stat().st_mode & 0o777 == 0o644
            assert (copy / "agent.py").stat().st_mtime_ns == 123_456_789_000
            assert (copy / "agent.py").stat().st_mode & 0o777 == 0o644
            assert Path(files.empty_file).read_bytes() == b""
            assert "nameserver" in Path(files.resolv_file).read_text()
            again = Stage(root, lambda: rootfs.file_lock(lock)).files(guest)
            assert again == files  # same content: the same copy
            (guest / "agent.py").write_text("X = 2\n")
            changed = Stage(root, lambda: rootfs.file_lock(lock)).files(guest)
            assert changed.guest_dir != files.guest_dir
            assert (Path(changed.guest_dir) / "agent.py").read_text() == "X = 2\n"
            assert (copy / "agent.py").read_text() == "X = 1\n"  # kept for running sandboxes
        finally:
            rootfs.unmount_rootfs(root)
        assert not os.path.ismount(root)


def test_stage_holds_the_real_guest() -> None:
    """The guest every sandbox runs is byte for byte the package's."""
    with Sandbox.create() as sb:
        res = sb.commands.run("cd /.abx/guest && sha256sum *.py", timeout=30)
        assert res.exit_code == 0, res
        inside = dict(reversed(ln.split("  ", 1)) for ln in res.stdout.splitlines())
        ours = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in GUEST_DIR.glob("*.py")}
        assert inside == ours
        # With its bytecode: a sandbox's start does not compile the guest again.
        tag = "$(python3 -c 'import sys; print(sys.implementation.cache_tag)')"
        assert sb.commands.run(f"test -f /.abx/guest/__pycache__/agent.{tag}.pyc").exit_code == 0
