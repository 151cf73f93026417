"""Volumes through the gateway's SDK classes and CLI: a key sees and deletes only its own;
an admin sees each volume's owner."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
from _gw import Gateway

from agent_sandbox import Volume
from agent_sandbox.core.errors import NotFoundError

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory
ABX = [sys.executable, "-m", "agent_sandbox.surfaces.cli"]


def _abx(gw: Gateway, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_SANDBOX_")}
    home = tempfile.mkdtemp(prefix="abx-home-")  # no ~/.abx/config of the developer's
    env.update(ABX_SANDBOX_BASE_URL=gw.url, ABX_SANDBOX_API_KEY=gw.tokens[who],
               HOME=home, COLUMNS="200")
    return subprocess.run([*ABX, *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_another_key_cannot_see_inspect_or_delete_a_volume(gw: Gateway) -> None:
    a, b, admin = gw.provider("a"), gw.provider("b"), gw.provider("admin")
    info = a.create()
    a.kill(info.sandbox_id)
    vid = info.volume_id
    try:
        assert vid in {v.volume_id for v in Volume.list(provider=a)}
        assert vid not in {v.volume_id for v in Volume.list(provider=b)}
        with pytest.raises(NotFoundError):
            Volume.inspect(vid, provider=b)
        with pytest.raises(NotFoundError):
            Volume.delete(vid, provider=b)
        owners = {v.volume_id: v.owner for v in Volume.list(provider=admin)}
        assert owners[vid] and owners[vid] == Volume.inspect(vid, provider=a).owner
        # The CLI, as key B: nothing of A's to list, inspect or remove.
        listed = _abx(gw, "b", "volume", "list", "--json")
        assert listed.returncode == 0 and vid not in listed.stdout
        assert _abx(gw, "b", "volume", "inspect", vid).returncode == 1
        refused = _abx(gw, "b", "volume", "rm", vid)
        assert refused.returncode == 1 and "not found" in refused.stderr
        assert vid in {v.volume_id for v in Volume.list(provider=a)}  # untouched
        # ... and as key A: its own.
        assert vid in _abx(gw, "a", "volume", "list").stdout
        removed = _abx(gw, "a", "volume", "rm", vid)
        assert removed.returncode == 0 and f"deleted {vid}" in removed.stdout
    finally:
        try:
            a.delete_volume(vid)
        except NotFoundError:
            pass
    assert vid not in {v.volume_id for v in Volume.list(provider=admin)}
