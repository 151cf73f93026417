"""Per-key quotas: live sandboxes and concurrent commands, answered 429 + Retry-After."""

from __future__ import annotations

import threading
import time

import pytest
from _gw import Gateway

from agent_sandbox.core.errors import ResourceExhaustedError
from agent_sandbox.remote import RemoteProvider

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory


def test_sandbox_quota(gw: Gateway) -> None:
    _, token = gw.keys.create("one-box", max_sandboxes=1)
    provider = RemoteProvider(gw.url, token)
    first = provider.create()
    try:
        with gw.http() as http:
            r = http.post("/v1/sandboxes", json={},
                          headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) > 0
        body = r.json()
        assert body["code"] == "resource_exhausted" and body["details"]["limit"] == 1
        with pytest.raises(ResourceExhaustedError, match="quota"):
            provider.create()
    finally:
        provider.kill(first.sandbox_id, delete_volume=True)
    # A slot is free again once the sandbox is gone.
    again = provider.create()
    provider.kill(again.sandbox_id, delete_volume=True)


def test_concurrent_command_quota(gw: Gateway, sandbox_a: str) -> None:
    provider = gw.provider("a")  # max_commands=2
    started = threading.Barrier(3)
    results: list[int] = []

    def slow() -> None:
        started.wait()
        results.append(provider.run(sandbox_a, "sleep 2").exit_code)

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait()
    # Both slots are taken for ~2 s; the third command is refused at once.
    time.sleep(0.5)
    with gw.http("a") as http:
        r = http.post(f"/v1/sandboxes/{sandbox_a}/commands", json={"cmd": "true"})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["details"]["quota"] == "max_commands"
    for t in threads:
        t.join()
    assert results == [0, 0]
    assert provider.run(sandbox_a, "true").exit_code == 0


def test_slow_uploads_hold_a_slot_of_their_own(gw: Gateway) -> None:
    """An upload holds a gateway thread while its client sends: a key's slow uploads are
    capped (as many as its commands) apart from its commands, so a running command never
    keeps the same key from uploading, and a key's idle uploads cannot starve the rest."""
    _, token = gw.keys.create("one-upload", max_sandboxes=1, max_commands=1)
    provider = RemoteProvider(gw.url, token)
    sandbox_id = provider.create().sandbox_id
    go = threading.Event()

    def trickle():  # an upload that stays open until told
        yield b"first"
        go.wait(60)
        yield b" last"

    try:
        slow = threading.Thread(target=provider.write_file,
                                args=(sandbox_id, "/tmp/slow", trickle()))
        slow.start()
        # The slow upload holds the slot once the guest has its temporary file; probing
        # before that could take the slot first (and the slow one would be the 429).
        deadline = time.monotonic() + 30
        while ".slow.abx" not in provider.run(sandbox_id, "ls -a /tmp").stdout:
            assert time.monotonic() < deadline, "the slow upload never reached the guest"
            time.sleep(0.05)
        with pytest.raises(ResourceExhaustedError, match="uploads at once"):
            provider.write_file(sandbox_id, "/tmp/second", b"x")
        # A command is not an upload: it still runs meanwhile.
        assert provider.run(sandbox_id, "echo ok").stdout == "ok\n"
        go.set()
        slow.join(60)
        assert b"".join(provider.read_file(sandbox_id, "/tmp/slow")) == b"first last"
        provider.write_file(sandbox_id, "/tmp/second", b"x")  # the slot came back
    finally:
        go.set()
        provider.kill(sandbox_id, delete_volume=True)
