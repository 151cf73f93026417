"""The cyclic garbage collector of a long-running server, set once its startup is done.

The collector scans every tracked object of the generations it collects. A server holds
~100k of them from its imports alone (modules, pydantic schemas), so a full collection
took 65-80 ms, and a burst of 200 MCP tool calls set off two of them mid-burst; the
youngest generation, collected every 700 allocations, ran ~80 times a burst and scanned
every request in flight each time: ~0.3 ms of server CPU per call in all (bench/mcp.py).
"""

from __future__ import annotations

import gc

# Net allocations of tracked objects between collections of the youngest generation.
YOUNG_THRESHOLD = 50_000


def settle() -> None:
    """Once startup is done: what exists now lives as long as the process, so it is
    frozen out of every later collection, and the young generation is collected less
    often (a few MB of short-lived objects may wait for it)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
