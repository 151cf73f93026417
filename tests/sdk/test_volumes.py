"""Volume.list / inspect / delete, on the embedded engine and through a gateway
(tests/sdk/conftest.py runs each test both ways)."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox import AsyncVolume, Sandbox, Volume
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, WrongStateError

pytestmark = pytest.mark.integration


def test_a_killed_sandbox_leaves_its_volume_to_list_inspect_and_delete() -> None:
    sb = Sandbox.create()
    volume_id = sb.volume_id
    try:
        sb.files.write("/workspace/keep.txt", "kept")
        in_use = Volume.inspect(volume_id)
        assert in_use.attached_to == sb.sandbox_id and in_use.size_mb > 0
        with pytest.raises(WrongStateError, match="attached"):
            Volume.delete(volume_id)
    finally:
        sb.kill()
    try:
        kept = Volume.inspect(volume_id)
        assert kept.attached_to == "" and kept.created_at > 0
        assert volume_id in {v.volume_id for v in Volume.list()}
        assert volume_id in {v.volume_id for v in asyncio.run(AsyncVolume.list())}
        again = Sandbox.create(volume=volume_id)  # what the kept volume is for
        try:
            assert again.files.read("/workspace/keep.txt") == "kept"
        finally:
            again.kill()
    finally:
        Volume.delete(volume_id)
    assert volume_id not in {v.volume_id for v in Volume.list()}
    with pytest.raises(NotFoundError):
        Volume.inspect(volume_id)
    with pytest.raises(NotFoundError):
        Volume.delete(volume_id)


def test_bad_volume_ids_are_refused() -> None:
    for bad in ("", "../etc", 7, "v" * 200):
        with pytest.raises(InvalidArgumentError, match="invalid volume id"):
            Volume.delete(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="classmethods"):
        Volume()
