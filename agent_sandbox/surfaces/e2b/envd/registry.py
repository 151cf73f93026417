"""What the gateway remembers of the processes E2B clients started: the config they gave
(``List`` reports it as envd does: cmd, args, envs, cwd), their tag, whether they run on a
terminal (and the attachment a ``Start`` stream holds, for input and resizes), and the
timer that kills them at the ``Start`` call's deadline (envd's process lifetime: a client
that only disconnects leaves its process running; its ``timeout`` ends it).

Bounded: at most ``PER_SANDBOX`` records and ``SANDBOX_BYTES`` per sandbox, ``TOTAL`` and
``TOTAL_BYTES`` in all (the oldest go first); a record goes when its process is seen to
end, or ``List`` finds it gone. A forgotten process still runs and is still listed (from
the sandbox's own process table), without the config it was started with, nor its
deadline (timers are bounded with the records)."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.core.pty import PtySession

PER_SANDBOX = 512
TOTAL = 8192
# A request may carry 4 MiB of command and environment: kept per sandbox, and in all.
SANDBOX_BYTES = 8 << 20
TOTAL_BYTES = 256 << 20
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
    timed_out: bool = False  # its deadline's kill fired

    @property
    def size(self) -> int:
        return (len(self.cmd) + len(self.cwd) + len(self.tag or "") + sum(map(len, self.args))
                + sum(len(k) + len(v) for k, v in self.envs.items()) + 256)


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: OrderedDict[tuple[str, int], Record] = OrderedDict()
        self._bytes = 0  # what the records' strings take, roughly

    def add(self, record: Record) -> None:
        key = (record.sandbox_id, record.pid)
        with self._lock:
            dropped = [self._pop(key)] if key in self._records else []
            self._records[key] = record
            self._bytes += record.size
            mine = [k for k in self._records if k[0] == record.sandbox_id]
            count, used = len(mine), sum(self._records[k].size for k in mine)
            for k in mine[:-1]:  # the oldest first; never the new one
                if count <= PER_SANDBOX and used <= SANDBOX_BYTES:
                    break
                gone = self._pop(k)
                count, used = count - 1, used - gone.size
                dropped.append(gone)
            while len(self._records) > TOTAL or self._bytes > TOTAL_BYTES:
                dropped.append(self._pop(next(iter(self._records))))
        for gone in dropped:
            _cancel(gone)

    def _pop(self, key: tuple[str, int]) -> Record:
        record = self._records.pop(key)
        self._bytes -= record.size
        return record

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
            self._pop((sandbox_id, pid))
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
        record.timed_out = True
        loop.run_in_executor(None, kill)

    record.timer = loop.call_later(max(0.0, delay), fire)
