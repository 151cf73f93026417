"""The guest agent as a process of its own on a unix socket, for tests that talk to it
through GuestClient."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from agent_sandbox.guestlink.client import GuestClient

AGENT = Path(__file__).resolve().parents[2] / "agent_sandbox" / "guest" / "agent.py"
# The guest runs on the template's python3 (3.9+); set this to test another interpreter.
GUEST_PYTHON = os.environ.get("ABX_TEST_GUEST_PYTHON", sys.executable)


@contextlib.contextmanager
def running_guest(folder: Path) -> Iterator[GuestClient]:
    """A guest listening on ``folder``/g.sock until the block ends."""
    sock = str(folder / "g.sock")
    proc = subprocess.Popen([GUEST_PYTHON, "-I", "-S", str(AGENT), "--unix", sock],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("abx-guest ready")
    try:
        yield GuestClient(sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)
