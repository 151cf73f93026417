"""The proxy's log (stderr, which the engine points at a file): what was refused, at most
a few lines a second so a sandbox cannot fill the host's disk with refusals."""

from __future__ import annotations

import sys
import time

_PER_WINDOW = 50
_WINDOW = 10.0
_MAX_TOTAL = 4 << 20  # bytes over the proxy's life; then one last line


class Log:
    def __init__(self) -> None:
        self._written = 0
        self._window = 0.0
        self._lines = 0
        self._dropped = 0

    def denied(self, message: str) -> None:
        now = time.monotonic()
        if now - self._window > _WINDOW:
            if self._dropped:
                self._write(f"({self._dropped} more refusals not logged)")
            self._window, self._lines, self._dropped = now, 0, 0
        if self._lines >= _PER_WINDOW:
            self._dropped += 1
            return
        self._lines += 1
        self._write(f"refused: {message}")

    def info(self, message: str) -> None:
        self._write(message)

    def _write(self, text: str) -> None:
        if self._written > _MAX_TOTAL:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        printable = "".join(c if c.isprintable() else "?" for c in text)[:500]
        line = f"{stamp} {printable}\n"
        self._written += len(line)
        if self._written > _MAX_TOTAL:
            line = f"{stamp} log full: nothing more is logged\n"
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except OSError:
            pass
