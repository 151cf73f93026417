"""pid 1 imports the operations a first command does not need on their first use (a cold
create waits for everything it imports before it answers). Such a late import looks its
module up by path (``/.abx/guest``, the host's stdlib under ``/.abx/hostusr``), so those
paths must stay the host's whatever the sandbox does: neither they nor ``/.abx`` can be
renamed, replaced or written from inside, and the late operations then still work."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

PROBE = r"""
import os
for path in ("/.abx", "/.abx/guest", "/.abx/hostusr"):
    try:
        os.rename(path, path + "-moved")
        print("renamed", path)
    except OSError as exc:
        print("refused", path, exc.errno)
for path in ("/.abx/guest/pty_ops.py", "/.abx/guest/evil.py",
             "/.abx/hostusr/lib/python3/evil.py"):
    try:
        with open(path, "w") as fh:
            fh.write("raise SystemExit")
        print("wrote", path)
    except OSError as exc:
        print("refused", path, exc.errno)
"""


def test_the_late_imports_of_pid_1_cannot_be_redirected_by_the_sandbox(sandbox, tmp_path):
    res = sandbox.commands.run(f"python3 -c '{PROBE}'", timeout=30)
    lines = res.stdout.splitlines()
    assert len(lines) == 6 and all(x.startswith("refused ") for x in lines), res.stdout
    # The operations pid 1 imports late, after the attempt: a terminal and a tar stream.
    pty = sandbox.pty.create()
    pty.send_input("exit 7\n")
    assert pty.wait(timeout=20) == 7
    sandbox.files.write("/workspace/d/a.txt", "late")
    sandbox.files.download_dir("/workspace/d", tmp_path / "d")
    assert (tmp_path / "d" / "a.txt").read_text() == "late"
