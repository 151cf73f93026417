"""agent_sandbox.surfaces.heap: a server's startup objects leave the collector's scans."""

from __future__ import annotations

import json
import subprocess
import sys

from agent_sandbox.surfaces import heap


def test_settle_freezes_startup_objects_and_collects_the_young_less_often() -> None:
    # In a process of its own: freezing is for the whole interpreter.
    code = ("import gc, json; import agent_sandbox.config.settings; "
            "from agent_sandbox.surfaces import heap; "
            "before = gc.get_threshold(); heap.settle(); "
            "print(json.dumps([gc.get_freeze_count(), before, gc.get_threshold()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    frozen, before, after = json.loads(out)
    assert frozen > 10_000  # the imports' objects (settings pulls in pydantic)
    assert after == [heap.YOUNG_THRESHOLD, before[1], before[2]]
