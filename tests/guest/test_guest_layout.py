"""The guest as the engine boots it: its directory alone on ``sys.path`` under
``python -I -S``, modules importing each other by plain name, no ``agent_sandbox``."""

from __future__ import annotations

import ast
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from _agent import GUEST_PYTHON

from agent_sandbox.runtime.guest_client import GuestClient

GUEST_DIR = Path(__file__).resolve().parents[2] / "agent_sandbox" / "guest"


def test_guest_boots_from_a_copy_of_its_directory(tmp_path: Path) -> None:
    """What oci.py runs as pid 1, from a directory with nothing else beside it."""
    guest = tmp_path / "guest"
    guest.mkdir()
    for source in GUEST_DIR.glob("*.py"):
        shutil.copy(source, guest / source.name)
    boot = f"import sys; sys.path.insert(0, {str(guest)!r}); import agent; agent.main()"
    sock = str(tmp_path / "g.sock")
    proc = subprocess.Popen([GUEST_PYTHON, "-I", "-S", "-X", "utf8", "-c", boot, "--unix", sock],
                            cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("abx-guest ready unix")
        client = GuestClient(sock)
        assert client.ping()["version"] == 1
        assert client.exec(["sh", "-c", "echo hi"], cwd="/").stdout == b"hi\n"
        client.write(str(tmp_path / "f"), b"data")
        assert b"".join(client.read(str(tmp_path / "f"))) == b"data"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)


def test_guest_modules_import_only_the_stdlib_and_each_other() -> None:
    """Nothing from the host's package or site-packages exists where the guest runs, and
    a guest module named like a stdlib one would shadow it there."""
    ours = {source.stem for source in GUEST_DIR.glob("*.py")}
    assert not ours & set(sys.stdlib_module_names)
    # The kernel bridge runs apart, on the kernel's own interpreter (which has pyzmq).
    for source in set(GUEST_DIR.glob("*.py")) - {GUEST_DIR / "kernel_bridge.py"}:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue  # relative imports: the package form of the same modules
            for name in names:
                top = name.split(".")[0]
                assert top in ours or top in sys.stdlib_module_names, (source.name, name)
