"""Real Node clients for the tests: a directory's ``package.json`` (exact versions: the one
place they are pinned) installed from npm into a cache outside the checkout
(``ABX_TEST_NODE_DIR``, default ``~/.cache/abx-test-node``, one folder per package name),
its ``*.mjs`` scripts copied into a folder of this checkout's own there, whose
``node_modules`` links to the shared one (ESM resolves packages beside the script).
Skips the test, saying why, without node/npm or a reachable registry."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def node_packages(here: Path) -> Path:
    """The cache folder holding ``here/package.json``'s packages and ``here/*.mjs``."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are needed to run the Node clients")
    wanted = (here / "package.json").read_text()
    root = Path(os.environ.get("ABX_TEST_NODE_DIR") or Path.home() / ".cache/abx-test-node")
    where = root / json.loads(wanted)["name"]
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time (xdist workers, sessions)
        manifest = where / "package.json"
        if not (where / "node_modules").is_dir() or not manifest.exists() \
                or manifest.read_text() != wanted:
            manifest.write_text(wanted)
            try:
                done = subprocess.run(["npm", "install", "--no-audit", "--no-fund"],
                                      cwd=where, capture_output=True, text=True, timeout=600)
            except subprocess.TimeoutExpired:
                manifest.unlink()
                pytest.skip("npm install took over 10 minutes (is the registry reachable?)")
            if done.returncode != 0:
                manifest.unlink()  # not installed: try again next time
                pytest.skip(f"npm install in {where} failed: {done.stderr[-500:]}")
    # This checkout's scripts in a folder of its own: the packages are shared, but another
    # checkout (a worktree's session running at the same time) has scripts of its own.
    mine = where / f"scripts-{hashlib.sha256(str(here.resolve()).encode()).hexdigest()[:12]}"
    mine.mkdir(exist_ok=True)
    if not (mine / "node_modules").is_symlink():
        with contextlib.suppress(FileExistsError):
            (mine / "node_modules").symlink_to("../node_modules")
    for script in here.glob("*.mjs"):
        shutil.copy(script, mine / script.name)
    return mine
