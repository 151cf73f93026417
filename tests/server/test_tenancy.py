"""Each sandbox belongs to the key that made it: others get 404 for it, never 403."""

from __future__ import annotations

import pytest
from _gw import Gateway

from agent_sandbox.core.errors import NotFoundError

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory


def test_other_key_cannot_read_list_exec_or_delete(gw: Gateway, sandbox_a: str) -> None:
    a, b = gw.provider("a"), gw.provider("b")
    a.write_file(sandbox_a, "/workspace/secret.txt", "A's")
    assert sandbox_a in {s.sandbox_id for s in a.list()}
    assert sandbox_a not in {s.sandbox_id for s in b.list()}
    for attempt in (
        lambda: b.info(sandbox_a),
        lambda: b.run(sandbox_a, "cat /workspace/secret.txt"),
        lambda: b.start(sandbox_a, "sleep 10"),
        lambda: b.read_file(sandbox_a, "/workspace/secret.txt"),
        lambda: b.write_file(sandbox_a, "/workspace/x", "x"),
        lambda: b.list_files(sandbox_a, "/workspace"),
        lambda: b.pause(sandbox_a),
        lambda: b.set_timeout(sandbox_a, 5),
        lambda: b.kill(sandbox_a, delete_volume=True),
    ):
        with pytest.raises(NotFoundError, match="not found"):
            attempt()
    # Still there, untouched, for its owner.
    assert a.info(sandbox_a).state == "running"
    assert b"".join(a.read_file(sandbox_a, "/workspace/secret.txt")) == b"A's"


def test_someone_elses_sandbox_looks_exactly_like_a_missing_one(gw: Gateway,
                                                                sandbox_a: str) -> None:
    with gw.http("b") as http:
        theirs = http.get(f"/v1/sandboxes/{sandbox_a}")
        missing = http.get("/v1/sandboxes/sbx-0000000000")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["code"] == missing.json()["code"] == "not_found"
    assert theirs.json()["message"].replace(sandbox_a, "ID") == \
        missing.json()["message"].replace("sbx-0000000000", "ID")


def test_admin_sees_and_reaches_every_sandbox(gw: Gateway, sandbox_a: str) -> None:
    admin = gw.provider("admin")
    assert sandbox_a in {s.sandbox_id for s in admin.list()}
    assert admin.run(sandbox_a, "echo hi").stdout == "hi\n"


def test_volumes_belong_to_their_key(gw: Gateway) -> None:
    a, b = gw.provider("a"), gw.provider("b")
    info = a.create()
    a.kill(info.sandbox_id)  # the volume is kept
    try:
        assert info.volume_id in {v.volume_id for v in a.list_volumes()}
        assert info.volume_id not in {v.volume_id for v in b.list_volumes()}
        with pytest.raises(NotFoundError):
            b.create(volume=info.volume_id)
        with pytest.raises(NotFoundError):
            b.delete_volume(info.volume_id)
    finally:
        a.delete_volume(info.volume_id)
    assert info.volume_id not in {v.volume_id for v in a.list_volumes()}
