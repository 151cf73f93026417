"""Another revision's guest agent, for paired before/after runs in one bench process."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUEST = "agent_sandbox/guest"
GUEST_PYTHON = "/usr/bin/python3"  # the interpreter pid 1 runs on


def export_guest(revision: str, into: Path) -> Path:
    """The guest directory of ``revision`` (git archive) under ``into``, precompiled as
    the engine's stage has it; ``into`` must be readable by the sandboxes' root."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", revision, GUEST],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return precompiled(into / GUEST)


def precompiled(source: Path) -> Path:
    subprocess.run([GUEST_PYTHON, "-m", "compileall", "-q", str(source)], check=True)
    return source
