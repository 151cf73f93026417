"""What the gateway remembers of the processes E2B clients started: the config they gave
(``List`` reports it as envd does: cmd, args, envs, cwd), their tag, whether they run on a
terminal (and the attachment a ``Start`` stream holds, for input and resizes), and the
timer that kills them at the ``Start`` call's deadline (envd's process lifetime: a client
that only disconnects leaves its process running; its ``timeout`` ends it).

Bounded: at most ``PER_SANDBOX`` records per sandbox and ``TOTAL`` in all (the oldest go
first); a record goes when its process is seen to end, or ``List`` finds it gone. A
forgotten process still runs and is still listed (from the sandbox's own process table),
only without the config it was started with."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.pty_session import PtySession

PER_SANDBOX = 512
TOTAL = 8192
MAX_TAG = 256  # characters


@dataclass
class Record:
    sandbox_id: str
    pid: int
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str
    user: str
    tag: str | None = None
    pty: bool = False
    session: PtySession | None = None  # the live attachment of a terminal's Start stream
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: OrderedDict[tuple[str, int], Record] = OrderedDict()

    def add(self, record: Record) -> None:
        with self._lock:
            key = (record.sandbox_id, record.pid)
            old = self._records.pop(key, None)
            self._records[key] = record
            mine = [k for k in self._records if k[0] == record.sandbox_id]
            evict = mine[:max(0, len(mine) - PER_SANDBOX)]
            evict += list(self._records)[:max(0, len(self._records) - TOTAL - len(evict))]
            dropped = [self._records.pop(k) for k in dict.fromkeys(evict) if k in self._records]
        for gone in ([old] if old is not None else []) + dropped:
            _cancel(gone)

    def get(self, sandbox_id: str, pid: int) -> Record | None:
        with self._lock:
            return self._records.get((sandbox_id, pid))

    def by_tag(self, sandbox_id: str, tag: str) -> Record | None:
        with self._lock:
            for record in reversed(self._records.values()):
                if record.sandbox_id == sandbox_id and record.tag == tag:
                    return record
        return None

    def of(self, sandbox_id: str) -> list[Record]:
        with self._lock:
            return [r for r in self._records.values() if r.sandbox_id == sandbox_id]

    def ended(self, sandbox_id: str, pid: int, record: Record | None = None) -> None:
        """The process has ended: forget it (only ``record`` if given: a pid the sandbox
        reused since is someone else's)."""
        with self._lock:
            found = self._records.get((sandbox_id, pid))
            if found is None or (record is not None and found is not record):
                return
            del self._records[(sandbox_id, pid)]
        _cancel(found)

    def keep_only(self, sandbox_id: str, running: set[int]) -> None:
        """Forget the sandbox's processes (not terminals) that are no longer running."""
        for record in self.of(sandbox_id):
            if not record.pty and record.pid not in running:
                self.ended(sandbox_id, record.pid, record)


def _cancel(record: Record) -> None:
    if record.timer is not None:
        record.timer.cancel()


def kill_at(loop: asyncio.AbstractEventLoop, record: Record, delay: float,
            kill: Any) -> None:
    """Call ``kill`` (blocking: in a worker thread) after ``delay`` seconds unless the
    record goes first."""
    def fire() -> None:
        record.timer = None
        loop.run_in_executor(None, kill)

    record.timer = loop.call_later(max(0.0, delay), fire)
