"""upload_dir/download_dir through the local daemon's unix socket, as an ordinary user:
the caller's side packs and extracts as that user, files come back owned by them."""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_daemon import GROUP, Daemon

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
    import json, os
    from pathlib import Path
    from agent_sandbox import Sandbox
    from agent_sandbox.remote import RemoteProvider

    home = Path.home()
    src = home / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("x = 1\\n")
    os.symlink("pkg/m.py", src / "m.py")
    sb = Sandbox.create(provider=RemoteProvider("unix://{socket}", retry_seconds=5))
    try:
        up = sb.files.upload_dir(src, "/workspace/proj")
        sb.commands.run("cd /workspace/proj && ln -s /etc esc && mkfifo fifo && "
                        "echo made > pkg/new.txt")
        down = sb.files.download_dir("/workspace/proj", home / "back")
    finally:
        sb.kill(delete_volume=True)
    back = home / "back"
    print(json.dumps({{
        "up": up.model_dump(), "down": down.model_dump(),
        "new": (back / "pkg" / "new.txt").read_text(),
        "link": os.readlink(back / "m.py"),
        "owners": sorted({{p.lstat().st_uid for p in back.rglob("*")}}),
    }}))
"""


@pytest.fixture(scope="module")
def daemon(abx_group: str) -> Iterator[Daemon]:
    folder = Path(tempfile.mkdtemp(prefix="abx-daemon-dirs-", dir="/tmp"))
    os.chmod(folder, 0o711)
    d = Daemon(folder).start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def abx_group() -> Iterator[str]:
    """The daemon's group (made for the test if the host has none)."""
    try:
        grp.getgrnam(GROUP)
        created = False
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, capture_output=True)
        created = True
    yield GROUP
    if created:
        subprocess.run(["groupdel", GROUP], capture_output=True)


def test_a_daemon_user_copies_directories_both_ways(daemon: Daemon, local_users: Any,
                                                    abx_group: str) -> None:
    user = local_users.create(groups=(abx_group,))
    script = textwrap.dedent(_SCRIPT.format(socket=daemon.socket))
    proc = user.run([user.python(), "-c", script],
                    env=user.env(PYTHONPATH=str(REPO)), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["up"]["files"], out["up"]["symlinks"]) == (1, 1)
    assert out["new"] == "made\n" and out["link"] == "pkg/m.py"
    assert out["owners"] == [user.uid]
    assert sorted(out["down"]["skipped"]) == [
        "esc: a symlink to /etc, outside the directory; skipped",
        "fifo: a fifo; skipped (only files, directories and symlinks are copied)"]
