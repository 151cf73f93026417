"""The console's built assets, committed in the package, are what its source builds to:
console/src rebuilt (esbuild and xterm.js from npm, the versions console/package.json pins)
into a temp dir must give the same files. A change to console/src without
`cd console && npm run build` fails here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from npmcache import node_packages

pytestmark = pytest.mark.integration  # npm's registry (once; cached outside the checkout)

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "agent_sandbox/surfaces/console/static"


def test_the_committed_assets_are_the_build_of_the_source(tmp_path: Path) -> None:
    where = node_packages(REPO / "console")
    env = {**os.environ, "ABX_CONSOLE_SRC": str(REPO / "console/src"),
           "ABX_CONSOLE_OUT": str(tmp_path), "ABX_CONSOLE_NODE_MODULES":
           str(where / "node_modules")}
    done = subprocess.run(["node", str(where / "build.mjs")], cwd=where, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("app.js", "app.css", "index.html"):
        assert (tmp_path / name).read_bytes() == (BUILT / name).read_bytes(), (
            f"{BUILT / name} is not the build of console/src: run `cd console && npm ci "
            "&& npm run build` and commit it")
