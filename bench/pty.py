"""Terminal latency: a keystroke typed into an interactive shell (bash, readline echoing
it) until its echo is back in ``on_data``, on the local provider and through a loopback
gateway's WebSocket, one terminal alone and with nine others busy printing.

Run by hand, as root: ``.venv/bin/python bench/pty.py [--n 300]``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ms, percentile, progress, table  # noqa: E402
from _gateway import engine_and_gateway  # noqa: E402

from agent_sandbox.core.provider import Provider  # noqa: E402

TARGET_MS = {"local": 5.0, "gateway": 10.0}  # p50 an interactive terminal feels instant at


class Echo:
    """on_data target that tells when a given byte has come back."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen = bytearray()

    def __call__(self, data: bytes) -> None:
        with self.cond:
            self.seen += data
            self.cond.notify_all()

    def wait_for(self, needle: bytes, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while needle not in self.seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{needle!r} never came back: {bytes(self.seen[-200:])!r}")
                self.cond.wait(left)
            del self.seen[: self.seen.index(needle) + len(needle)]


def keystrokes(provider: Provider, sid: str, n: int) -> list[float]:
    echo = Echo()
    term = provider.pty_open(sid, on_data=echo)  # the login shell (root: a "# " prompt)
    try:
        echo.wait_for(b"# ")
        samples = []
        for i in range(n + 10):
            with echo.cond:
                echo.seen.clear()
            started = time.perf_counter()
            term.send_input(b"x")
            echo.wait_for(b"x")
            if i >= 10:  # warm-up keystrokes are not counted
                samples.append((time.perf_counter() - started) * 1000)
            term.send_input(b"\x7f")  # backspace: the line stays short
            echo.wait_for(b"\x08")
        return samples
    finally:
        term.kill()
        term.close()


def busy_neighbours(provider: Provider, sid: str, count: int) -> list[object]:
    """Terminals printing steadily (a line every 10 ms) while the keystrokes are timed."""
    return [provider.pty_open(sid, cmd="while :; do date; sleep 0.01; done",
                              on_data=lambda _: None) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    rows = []
    with engine_and_gateway() as setup:  # loopback, no keys: open
        for name, provider in (("local", setup.local), ("gateway", setup.remote())):
            sid = provider.create().sandbox_id
            try:
                progress(f"{name}: {args.n} keystrokes, one terminal")
                alone = keystrokes(provider, sid, args.n)
                progress(f"{name}: {args.n} keystrokes, nine other terminals printing")
                others = busy_neighbours(provider, sid, 9)
                try:
                    busy = keystrokes(provider, sid, args.n)
                finally:
                    for term in others:
                        term.kill()  # type: ignore[attr-defined]
                        term.close()  # type: ignore[attr-defined]
                rows.append([name, fmt_ms(percentile(alone, 50)), fmt_ms(percentile(alone, 95)),
                             fmt_ms(percentile(busy, 50)), fmt_ms(percentile(busy, 95)),
                             f"< {fmt_ms(TARGET_MS[name])}"])
            finally:
                provider.kill(sid, delete_volume=True)
    print(table(["provider", "echo p50", "echo p95", "with 9 busy p50", "with 9 busy p95",
                 "target p50"], rows, title=f"Keystroke echo latency ({args.n} keys)"))


if __name__ == "__main__":
    main()
