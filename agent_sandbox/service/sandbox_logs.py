"""Each sandbox's log (``SandboxService.logs``): what happened to it, kept by this process
in a bounded ring per sandbox (``KEPT`` lines, each cut at ``MAX_LINE`` characters), and
the tail of its template's start command output, read from its guest when asked (at most
``START_TAIL`` bytes: the sandbox writes it, so it is hostile input, bounded like any).
Forgotten with the sandbox."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from agent_sandbox.core.models import SandboxLogEntry

KEPT = 500  # lifecycle lines kept per sandbox (the oldest go first)
MAX_LINE = 2048  # characters of one line; the rest is cut
START_TAIL = 64 << 10  # bytes of the start command's output read (the tail)
MAX_ENTRIES = 1000  # lines one answer holds at most (E2B's limit)


def cut(text: str) -> str:
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 1] + "…"


@dataclass
class _Log:
    lines: deque[SandboxLogEntry] = field(default_factory=lambda: deque(maxlen=KEPT))
    start: tuple[int, float] | None = None  # the start command's pid and start time


class SandboxLogs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, _Log] = {}

    def record(self, sandbox_id: str, message: str, level: str = "info") -> None:
        entry = SandboxLogEntry(timestamp=time.time(), level=level,  # type: ignore[arg-type]
                                message=cut(message))
        with self._lock:
            self._logs.setdefault(sandbox_id, _Log()).lines.append(entry)

    def started(self, sandbox_id: str, pid: int) -> None:
        """The template's start command runs as ``pid``: its output is part of the log."""
        with self._lock:
            self._logs.setdefault(sandbox_id, _Log()).start = (pid, time.time())

    def start_of(self, sandbox_id: str) -> tuple[int, float] | None:
        with self._lock:
            log = self._logs.get(sandbox_id)
            return log.start if log else None

    def lines(self, sandbox_id: str) -> list[SandboxLogEntry]:
        with self._lock:
            log = self._logs.get(sandbox_id)
            return list(log.lines) if log else []

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._logs.pop(sandbox_id, None)

    def keep_only(self, sandbox_ids: set[str]) -> None:
        """Drop the logs of sandboxes gone by another way (another process ended them)."""
        with self._lock:
            for gone in set(self._logs) - sandbox_ids:
                del self._logs[gone]


def output_lines(stdout: str, stderr: str, at: float) -> list[SandboxLogEntry]:
    """A start command's output as log lines (stderr's at level error), each cut."""
    out = []
    for text, level in ((stdout, "info"), (stderr, "error")):
        for line in text.splitlines()[-MAX_ENTRIES:]:
            if line.strip():
                out.append(SandboxLogEntry(timestamp=at, level=level,  # type: ignore[arg-type]
                                           message=cut(line), source="start"))
    return out
