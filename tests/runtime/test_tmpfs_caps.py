"""The sandbox's tmpfs (/dev, /dev/shm) are host memory: capped in bytes and in files,
so a sandbox cannot spend the host's memory through them (rootless sandboxes have no
cgroup to charge them to). Run as root here and as a user by rootless_battery.py."""

from __future__ import annotations

import json

import pytest

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration

_FILL = """
import json, os, sys
made, err = 0, None
for i in range(100000):
    try:
        open(f"{sys.argv[1]}/f{i}", "w").close()
        made += 1
    except OSError as e:
        err = e.errno
        break
print(json.dumps({"made": made, "errno": err}))
"""


def test_tmpfs_inodes_and_size_are_capped(sandbox: Sandbox) -> None:
    sandbox.files.write("/workspace/fill.py", _FILL)
    for folder in ("/dev/shm", "/dev"):
        res = sandbox.commands.run(f"python3 /workspace/fill.py {folder}", timeout=120)
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["errno"] == 28 and out["made"] < 20000, (folder, out)  # ENOSPC
        sandbox.commands.run(f"rm -f {folder}/f*")
    res = sandbox.commands.run("head -c 100M /dev/zero > /dev/shm/big; echo rc=$?; "
                               "stat -c %s /dev/shm/big; rm -f /dev/shm/big", timeout=60)
    assert "No space left" in res.stderr, res
    assert int(res.stdout.split()[-1]) <= 64 << 20, res


def test_shm_is_at_most_the_memory_limit() -> None:
    with Sandbox.create(memory_mb=32) as sb:
        df = sb.commands.run("df -k /dev/shm | tail -1").stdout.split()
        assert int(df[1]) <= 32 * 1024, df
