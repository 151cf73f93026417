"""What a terminal printed, collected from an ``on_data`` callback, and waiting for text
to show up in it (shared by the terminal tests)."""

from __future__ import annotations

import re
import threading
import time


class Screen:
    """``on_data`` target: keeps every byte; ``expect`` waits for a pattern."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.cond = threading.Condition()
        self.mark = 0  # where the next expect() starts looking

    def __call__(self, chunk: bytes) -> None:
        assert isinstance(chunk, bytes), type(chunk)
        with self.cond:
            self.data += chunk
            self.cond.notify_all()

    def text(self) -> str:
        with self.cond:
            return self.data.decode("utf-8", "replace")

    def expect(self, pattern: str | bytes, timeout: float = 15.0) -> re.Match[bytes]:
        """Wait for ``pattern`` (a regex) in the output after the last match."""
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = regex.search(bytes(self.data), self.mark)
                if found:
                    self.mark = found.end()
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = bytes(self.data[-600:]).decode("utf-8", "replace")
                    raise AssertionError(f"{pattern!r} not seen in {timeout}s; the terminal "
                                         f"ends with: {tail!r}")
                self.cond.wait(left)
