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

from agent_sandbox.guestlink.client import GuestClient

GUEST_DIR = Path(__file__).resolve().parents[2] / "agent_sandbox" / "guest"


def _boot_copy(tmp_path: Path) -> tuple[Path, str, subprocess.Popen[str]]:
    """pid 1 as oci.py starts it, from a copy of the guest's directory (writable here)."""
    guest = tmp_path / "guest"
    guest.mkdir()
    for source in GUEST_DIR.glob("*.py"):
        shutil.copy(source, guest / source.name)
    boot = f"import sys; sys.path.insert(0, {str(guest)!r}); import agent; agent.main()"
    sock = str(tmp_path / "g.sock")
    proc = subprocess.Popen([GUEST_PYTHON, "-I", "-S", "-X", "utf8", "-c", boot, "--unix", sock],
                            cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    return guest, sock, proc


def test_guest_boots_from_a_copy_of_its_directory(tmp_path: Path) -> None:
    """What oci.py runs as pid 1, from a directory with nothing else beside it."""
    guest, sock, proc = _boot_copy(tmp_path)
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


def test_a_writable_guest_directory_gives_pid1_no_code_later(tmp_path: Path) -> None:
    """A Pod's /.abx/guest is in the image's writable layer, first on pid 1's path: what
    the sandbox writes there later (a guest module imported on first use, a stdlib
    module's name) must never run in pid 1."""
    guest, sock, proc = _boot_copy(tmp_path)
    marker = tmp_path / "pwned"
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("abx-guest ready unix")
        plant = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
        names = ["dir_unpack", "watch_inotify", "watch_poll", "pty_proc", "tarfile",
                 "shutil", "subprocess", "termios", "fcntl", "hmac", "resource", "functools"]
        for name in names:
            (guest / f"{name}.py").write_text(plant)
        for stale in (guest / "__pycache__").glob("*"):
            stale.unlink()
        client = GuestClient(sock)
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "f").write_text("x")
        calls = [lambda: client.exec(["true"], cwd="/"),
                 lambda: b"".join(client.read_tar(str(tmp_path / "d"))),
                 lambda: client.write(str(tmp_path / "d" / "g"), b"y"),
                 lambda: client.write_tar(str(tmp_path / "e"), [_tar_of("f", b"z")]),
                 lambda: client.remove(str(tmp_path / "d"), recursive=True)]
        for call in calls:
            try:
                call()
            except Exception:  # noqa: BLE001 - refused is fine; running the code is not
                pass
        assert not marker.exists(), marker.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)


def _tar_of(name: str, data: bytes) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
