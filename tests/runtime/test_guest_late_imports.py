"""pid 1's late imports must never find code the sandbox wrote.

The guest imports some operations on first use (``server.LATER``) and a few standard
modules inside functions, by path names under ``/.abx``. In a template without its own
``/.abx`` (any imported directory or image), runc makes that directory in the sandbox's
writable layer: renaming it away and making a new ``/.abx/guest`` put sandbox code on
pid 1's import path."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.providers.local import local_provider

_BUSYBOX = Path("/bin/busybox")

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not _BUSYBOX.exists() or subprocess.run([str(_BUSYBOX), "--help"],
                                            capture_output=True).returncode != 0,
    reason="needs a static busybox (apt-get install busybox-static)")]

_PLANT = (
    "mv /.abx /.abx.old 2>&1; mkdir -p /.abx/guest /.abx/hostusr/lib/python3.11; "
    "for m in /.abx/guest/pty_ops /.abx/guest/dir_ops /.abx/hostusr/lib/python3.11/tarfile; do "
    "echo 'open(\"/workspace/pwned\", \"a\").write(__name__ + \"\\n\")' > $m.py; done; "
    "ls /.abx.old >/dev/null 2>&1 && echo renamed || echo refused")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("bb") / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(_BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "mv", "mkdir", "echo", "ls", "cat"):
        os.symlink("busybox", root / "bin" / applet)
    name = f"t-{uuid.uuid4().hex[:10]}"
    store = local_provider().backend.templates
    store.import_dir(name, root)
    yield name
    store.remove(name)


def test_pid1_imports_nothing_the_sandbox_wrote(template: str, tmp_path: Path) -> None:
    with Sandbox.create(template=template) as sb:
        planted = sb.commands.run(_PLANT)
        assert planted.exit_code == 0, planted
        for call in (lambda: sb.pty.create(),
                     lambda: sb.files.download_dir("/bin", tmp_path / "out")):
            try:
                call()
            except Exception:  # noqa: BLE001 - refused is fine; running the code is not
                pass
        assert sb.commands.run("cat /workspace/pwned 2>/dev/null").stdout == ""
        # The guest still serves its own operations; its run dir is still the sandbox's.
        sb.pty.create().kill()
        assert sb.commands.run("touch /.abx/run/mine").exit_code == 0
