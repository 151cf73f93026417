"""An audit trail: one JSON line per event (an MCP tool call, a sandbox the reaper ended),
sizes only, never contents or secrets.

Written straight to an ``O_APPEND`` file (0600), one ``write`` per line, rotated at
``MAX_BYTES`` keeping ``BACKUPS`` old files (``audit.log.1`` ...). No ``logging`` machinery:
this runs on the event loop once per call, and the logging module's record, handler and
rollover checks cost several times the write itself.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5

log = logging.getLogger(__name__)


class AuditLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0
        self._lock = threading.Lock()
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._open()

    def _open(self) -> None:
        assert self.path is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        self._fd, self._size = fd, os.fstat(fd).st_size

    def _rotate(self) -> None:
        assert self.path is not None and self._fd is not None
        os.close(self._fd)
        self._fd = None
        for n in range(BACKUPS - 1, 0, -1):
            older = Path(f"{self.path}.{n}")
            if older.exists():
                os.replace(older, f"{self.path}.{n + 1}")
        os.replace(self.path, f"{self.path}.1")
        self._open()

    @property
    def enabled(self) -> bool:
        """Whether records are written (no log configured: ``record`` does nothing)."""
        return self._fd is not None

    def record(self, **fields: Any) -> None:
        if self._fd is None:
            return
        entry = {"time": round(time.time(), 3), **fields}
        line = (json.dumps(entry, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                if self._size and self._size + len(line) > MAX_BYTES:
                    self._rotate()
                os.write(self._fd, line)
                self._size += len(line)
            except OSError:  # a full disk must not fail the tool call it records
                log.exception("could not write the audit log %s", self.path)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
