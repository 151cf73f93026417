"""Other versions of Python packages for the tests (e.g. the oldest E2B SDK we support), in
a venv per set of requirements, cached outside the checkout (``ABX_TEST_PY_DIR``, default
``~/.cache/abx-test-python``). Skips the test, saying why, when the index is unreachable."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest


def python_with(name: str, requirements: list[str]) -> Path:
    """The python of a venv named ``name`` holding exactly ``requirements`` (pinned)."""
    root = Path(os.environ.get("ABX_TEST_PY_DIR") or Path.home() / ".cache/abx-test-python")
    where = root / name
    where.mkdir(parents=True, exist_ok=True)
    python = where / "bin" / "python"
    wanted = "\n".join(requirements) + "\n"
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time
        stamp = where / "requirements.txt"
        if python.exists() and stamp.exists() and stamp.read_text() == wanted:
            return python
        stamp.unlink(missing_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(where)], check=True,
                       capture_output=True, timeout=120)
        try:
            done = subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements],
                                  capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip install {' '.join(requirements)} took over 10 minutes")
        if done.returncode != 0:
            pytest.skip(f"pip install {' '.join(requirements)} failed (is the package index "
                        f"reachable?): {done.stderr[-400:]}")
        stamp.write_text(wanted)
    return python
