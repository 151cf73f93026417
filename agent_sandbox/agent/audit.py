"""The audit trail: one JSON line per tool call, sizes only, never contents or secrets."""

from __future__ import annotations

import json
import logging
import os
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5


class _PrivateRotatingHandler(RotatingFileHandler):
    """A rotating handler whose files are created 0600 (tool calls are sensitive metadata)."""

    def _open(self):  # type: ignore[no-untyped-def]
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, self.mode.replace("w", "a"), encoding=self.encoding)


class AuditLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._logger: logging.Logger | None = None
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        logger = logging.getLogger(f"agent_sandbox.audit.{path}")
        logger.propagate = False  # never onto stderr/stdout, only the file
        logger.setLevel(logging.INFO)
        if not logger.handlers:
            handler = _PrivateRotatingHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS,
                                              encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
        self._logger = logger

    def record(self, **fields: Any) -> None:
        if self._logger is None:
            return
        entry = {"time": round(time.time(), 3), **fields}
        self._logger.info(json.dumps(entry, separators=(",", ":"), default=str))

    def close(self) -> None:
        if self._logger is not None:
            for handler in list(self._logger.handlers):
                handler.close()
                self._logger.removeHandler(handler)
