"""``abx volume list|inspect|rm`` on this host's engine, and what ``abx sandbox kill``
says about the volume it keeps."""

from __future__ import annotations

import pytest
from conftest import Abx

pytestmark = pytest.mark.integration


def test_kill_says_the_volume_was_kept_and_volume_commands_manage_it(abx: Abx) -> None:
    info = abx("sandbox", "create", "--json", timeout=120).json()
    sid, vid = info["sandbox_id"], info["volume_id"]
    try:
        used = abx("volume", "inspect", vid, "--json").json()
        assert used["attached_to"] == sid
        refused = abx("volume", "rm", vid, check=1)
        assert "attached" in refused.err and "kill that sandbox first" in refused.err
        killed = abx("sandbox", "kill", sid)
        assert f"killed {sid}" in killed.out
        assert f"volume {vid} was kept" in killed.err
        assert f"abx volume rm {vid}" in killed.err
        listed = abx("volume", "list", "--json").json()
        assert {"volume_id": vid, "attached_to": ""}.items() <= \
            next(v for v in listed if v["volume_id"] == vid).items()
        table = abx("volume", "list", "--kept").out
        assert vid in table and "(kept)" in table
        shown = abx("volume", "inspect", vid)
        assert "size limit" in shown.out and f"abx volume rm {vid}" in shown.err
        assert abx("volume", "rm", vid).out.strip() == f"deleted {vid}"
        assert "not found" in abx("volume", "rm", vid, check=1).err
        assert "not found" in abx("volume", "inspect", vid, check=1).err
        gone = abx("sandbox", "create", "--json", timeout=120).json()
        out = abx("sandbox", "kill", gone["sandbox_id"], "--delete-volume", "--json").json()
        assert out == {"sandbox_id": gone["sandbox_id"], "killed": True,
                       "volume_id": gone["volume_id"], "volume_kept": False}
        assert gone["volume_id"] not in abx("volume", "list").out
    finally:
        abx("sandbox", "kill", sid, "--delete-volume", check=None)
        abx("volume", "rm", vid, check=None)


def test_volume_errors_and_help(abx: Abx) -> None:
    assert "invalid volume id" in abx("volume", "rm", "../x", check=1).err
    for command in (["list"], ["inspect"], ["rm"]):
        assert "Example" in abx("volume", *command, "--help").out
