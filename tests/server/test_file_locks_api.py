"""File locks and conditional writes through the REST API and the remote SDK (issue 29):
versions in reads (ETag) and listings, If-Match / if_match writes (412 conflict), lock and
unlock, 423 locked with Retry-After, and the inputs refused. On the memory backend: the
subject is the gateway's mapping; the guest's locks are the real ones."""

from __future__ import annotations

import threading

import pytest
from _gw import Gateway

from agent_sandbox.core.errors import ConflictError, InvalidArgumentError, LockedError
from agent_sandbox.sdk import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.quick]
F = "/workspace/locks/f.txt"


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    return gw_memory


def test_versions_conditional_writes_and_locks_over_rest(gw: Gateway, sandbox_a: str) -> None:
    a = gw.provider("a")
    base = f"/v1/sandboxes/{sandbox_a}/files"
    a.write_file(sandbox_a, F, "v1")
    with gw.http("a") as http:
        got = http.get(f"{base}/content", params={"path": F})
        etag = got.headers["etag"]
        version = etag.strip('"')
        assert got.content == b"v1" and version
        assert http.get(f"{base}/stat", params={"path": F}).json()["version"] == version
        listed = http.get(base, params={"path": "/workspace/locks"}).json()
        assert [e["version"] for e in listed] == [version]
        # If-Match, the standard header: the right version writes, a stale one is refused.
        ok = http.put(f"{base}/content", params={"path": F}, content=b"v2",
                      headers={"If-Match": etag})
        assert ok.status_code == 200, ok.text
        stale = http.put(f"{base}/content", params={"path": F, "if_match": version},
                         content=b"v3")
        assert stale.status_code == 412 and stale.json()["code"] == "conflict"
        current = stale.json()["details"]["current_version"]
        assert current == http.get(f"{base}/stat", params={"path": F}).json()["version"]

        # An explicit lock: others get 423 with Retry-After and who holds it.
        held = http.post(f"{base}/lock", json={"path": F, "ttl": 30, "holder": "editor"})
        assert held.status_code == 200, held.text
        token = held.json()["token"]
        assert held.json()["holder"] == "a: editor"
        blocked = http.put(f"{base}/content", params={"path": F, "lock_wait": 0},
                           content=b"x")
        assert blocked.status_code == 423, blocked.text
        assert 1 <= int(blocked.headers["retry-after"]) <= 5
        body = blocked.json()
        assert body["code"] == "locked" and body["details"]["holder"] == "a: editor"
        assert body["details"]["path"] == F and "locked by a: editor" in body["message"]
        # The SDK over REST sees the same error classes.
        with pytest.raises(LockedError) as err:
            a.write_file(sandbox_a, F, "y", lock_wait=0)
        assert err.value.retry_after >= 1 and err.value.details["holder"] == "a: editor"
        a.write_file(sandbox_a, F, "mine", lock_token=token)
        assert http.post(f"{base}/unlock", json={"path": F, "token": token}).status_code == 204
        a.write_file(sandbox_a, F, "free", lock_wait=0)
        # A holder's locks go together (a client's session ended).
        a.lock_file(sandbox_a, F, 30, holder="session-9")
        assert a.release_locks(sandbox_a, "session-9") == 1
        a.write_file(sandbox_a, F, "free again", lock_wait=0)


def test_bad_lock_input_is_refused(gw: Gateway, sandbox_a: str) -> None:
    a = gw.provider("a")
    base = f"/v1/sandboxes/{sandbox_a}/files"
    with gw.http("a") as http:
        for body in ({"path": "relative", "ttl": 5}, {"path": F, "ttl": 0},
                     {"path": F, "ttl": 1e9}, {"path": F, "wait": 31},
                     {"path": F, "token": "../../x"}, {"path": "/workspace/"}):
            r = http.post(f"{base}/lock", json=body)
            assert r.status_code == 400 and r.json()["code"] == "invalid_argument", (body, r.text)
        r = http.put(f"{base}/content", params={"path": F, "lock_wait": -1}, content=b"")
        assert r.status_code == 400
    with pytest.raises(InvalidArgumentError, match="if_match"):
        a.write_file(sandbox_a, F, "x", if_match='bad"quote')
    with pytest.raises(InvalidArgumentError, match="ttl"):
        a.lock_file(sandbox_a, F, -1)


def test_sdk_read_modify_write_keeps_every_increment(gw: Gateway, sandbox_a: str) -> None:
    """Two clients (the key's quota: two uploads at once) racing read-modify-write cycles
    with if_match and retries."""
    sandboxes = [Sandbox.connect(sandbox_a, provider=gw.provider("a")) for _ in range(2)]
    path = "/workspace/locks/counter"
    sandboxes[0].files.write(path, "0")
    per = 15

    def bump(sb: Sandbox) -> None:
        for _ in range(per):
            while True:
                text, version = sb.files.read_with_version(path)
                try:
                    sb.files.write(path, str(int(text) + 1), if_match=version)
                    break
                except (ConflictError, LockedError):
                    continue

    threads = [threading.Thread(target=bump, args=(sb,)) for sb in sandboxes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sandboxes[0].files.read(path) == str(per * len(sandboxes))
    lock = sandboxes[0].files.lock(path, 30)
    with pytest.raises(LockedError):
        sandboxes[1].files.write(path, "no", lock_wait=0)
    sandboxes[0].files.write(path, "yes", lock=lock)
    sandboxes[0].files.unlock(lock)
    assert sandboxes[0].files.stat(path).version == sandboxes[1].files.read_with_version(
        path)[1]


def test_one_key_cannot_hold_every_gateway_thread_waiting_for_locks(
        gw: Gateway, sandbox_a: str) -> None:
    """Each lock call waiting for its turn holds a gateway thread up to 30 s: one key's
    are bounded (429 past its quota, at once), so its waits cannot take every thread
    other keys' calls need."""
    most = 16  # quotas.LOCK_CALLS_PER_KEY
    base = f"/v1/sandboxes/{sandbox_a}/files"
    path = "/workspace/locks/busy.txt"
    gw.provider("a").write_file(sandbox_a, path, "x")
    statuses: list[int] = []
    with gw.http("a") as http:
        held = http.post(f"{base}/lock", json={"path": path, "ttl": 30, "holder": "one"})
        assert held.status_code == 200, held.text

        def wait() -> None:
            reply = http.post(f"{base}/lock", json={"path": path, "ttl": 5, "wait": 2,
                                                    "holder": "other"}, timeout=30)
            statuses.append(reply.status_code)

        threads = [threading.Thread(target=wait) for _ in range(most + 4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        http.post(f"{base}/unlock", json={"path": path, "token": held.json()["token"]})
    assert statuses.count(429) >= 4 and set(statuses) == {423, 429}, statuses
