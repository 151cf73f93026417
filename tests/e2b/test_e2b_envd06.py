"""What envd >= 0.6 adds, through the real e2b SDK (the gateway answers as envd 0.6.4, so
the SDK's version gates let it all through): file metadata (``files.write(metadata=...)``,
back in ``get_info``, listings and renames; an overwrite clears it; xattrs a process in
the sandbox sets itself, bounded), entries in watch events (``include_entry``), and
signed ``download_url`` / ``upload_url`` (E2B's signature of path, operation, user and
expiration under the sandbox's access token; in the single-URL mode the URL names no
sandbox: the signature finds it). The same metadata through our own SDK."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sb(gateway_env: E2BGateway) -> Iterator[Any]:
    from e2b import Sandbox

    sandbox = Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_envd_version_lets_the_sdk_gates_through(sb: Any) -> None:
    from e2b.envd.versions import ENVD_VERSION_WATCH_NETWORK_MOUNTS

    assert sb._envd_version >= ENVD_VERSION_WATCH_NETWORK_MOUNTS


def test_file_metadata(sb: Any, e2b_gateway: E2BGateway) -> None:
    from e2b import InvalidArgumentException
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    files = sb.files
    info = files.write("meta/a.txt", "x", metadata={"Author": "mish", "purpose": "up load"})
    assert info.metadata == {"author": "mish", "purpose": "up load"}  # keys lowercased
    assert files.get_info("meta/a.txt").metadata == info.metadata
    octet = files.write("meta/b.txt", "y", metadata={"k": "v"}, use_octet_stream=True)
    assert octet.metadata == {"k": "v"} == files.get_info("meta/b.txt").metadata
    both = files.write_files([WriteEntry(path="meta/c.txt", data="1"),
                              WriteEntry(path="meta/d.txt", data="2")], metadata={"s": "t"})
    assert [w.metadata for w in both] == [{"s": "t"}] * 2
    listed = {e.name: e.metadata for e in files.list("meta")}
    assert listed == {"a.txt": info.metadata, "b.txt": {"k": "v"}, "c.txt": {"s": "t"},
                      "d.txt": {"s": "t"}}
    assert files.rename("meta/b.txt", "meta/e.txt").metadata == {"k": "v"}
    # An overwrite without metadata clears the old (as envd), with other metadata replaces.
    assert files.write("meta/a.txt", "z").metadata is None
    assert files.get_info("meta/a.txt").metadata is None
    assert files.write("meta/e.txt", "z", metadata={"n": "1"}).metadata == {"n": "1"}
    assert files.get_info("meta/e.txt").metadata == {"n": "1"}
    with pytest.raises(InvalidArgumentException):  # the SDK's own check
        files.write("meta/bad.txt", "x", metadata={"bad key": "v"})

    # A process in the sandbox sets what it likes: only what a write could have set is
    # shown (printable ASCII, header-token keys, 4096 bytes in all); nothing else breaks.
    made = sb.commands.run(
        "cd /home/user/meta && python3 -c \"import os\n"
        "os.setxattr('a.txt', 'user.e2b.ok', b'fine')\n"
        "os.setxattr('a.txt', 'user.e2b.bin', bytes(range(256)))\n"
        "os.setxattr('a.txt', 'user.e2b.sp ace', b'v')\n"
        "os.setxattr('a.txt', 'user.other', b'not ours')\n"
        "try:\n"
        "    for i in range(20): os.setxattr('c.txt', f'user.e2b.k{i:02d}', b'v' * 1000)\n"
        "except OSError: pass\"")  # as many as its filesystem holds
    assert made.exit_code == 0, made.stderr
    assert files.get_info("meta/a.txt").metadata == {"ok": "fine"}
    shown = files.get_info("meta/c.txt").metadata
    assert shown and sum(len("user.e2b.") + len(k) + len(v) for k, v in shown.items()) <= 4096
    assert {e.name for e in files.list("meta")} >= {"a.txt", "c.txt"}

    # Our server checks too (a client other than the SDK): 400, nothing written.
    import httpx2

    with httpx2.Client(base_url=e2b_gateway.url, timeout=60, headers={
            "E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sb._envd_access_token}) as http:
        for bad in ({"X-Metadata-k": "tab\there"}, {"X-Metadata-big": "v" * 5000}):
            reply = http.post("/files", params={"path": "meta/raw.txt"}, content=b"x",
                              headers={"Content-Type": "application/octet-stream", **bad})
            assert reply.status_code == 400, reply.text
            assert "metadata" in reply.json()["message"]
    assert not files.exists("meta/raw.txt")


def test_watch_events_carry_their_entry(sb: Any) -> None:
    from e2b import FilesystemEventType, FileType

    sb.files.make_dir("watched")
    handle = sb.files.watch_dir("watched", include_entry=True)
    try:
        sb.files.write("watched/f.txt", "data", metadata={"m": "1"})
        sb.files.remove("watched/f.txt")
        events = []
        for _ in range(50):
            events += handle.get_new_events()
            if any(e.type == FilesystemEventType.REMOVE for e in events):
                break
    finally:
        handle.stop()
    kinds = [e.type for e in events]
    assert FilesystemEventType.WRITE in kinds and FilesystemEventType.REMOVE in kinds
    # Entries are envd's best effort: what was there when the event was read (the file
    # may be gone by then); never on a remove.
    for event in events:
        if event.type == FilesystemEventType.REMOVE:
            assert event.entry is None
        elif event.entry is not None:
            assert (event.entry.path, event.entry.type) == ("/home/user/watched/f.txt",
                                                            FileType.FILE)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, data: bytes) -> int:
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _with(url: str, **changes: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query.update(changes)
    return parts._replace(query=urllib.parse.urlencode(query)).geturl()


def test_signed_urls(sb: Any, e2b_gateway: E2BGateway) -> None:
    """No header names the sandbox nor carries its token: the URL alone, as a browser or
    curl would use it."""
    import json

    sb.files.write("signed.txt", "for a browser")
    url = sb.download_url("signed.txt", "user")
    assert url.startswith(e2b_gateway.url + "/files?")  # the single-URL mode: no sandbox
    assert _get(url) == (200, b"for a browser")
    assert _get(sb.download_url("signed.txt", "user", 120)) == (200, b"for a browser")
    expired = _get(sb.download_url("signed.txt", "user", use_signature_expiration=-120))
    assert (expired[0], json.loads(expired[1])) == (
        401, {"code": 401, "message": "signature is already expired"})

    upload = sb.upload_url("up/loaded.txt", "user")
    assert _post(upload, b"uploaded") == 200
    assert sb.files.read("up/loaded.txt") == "uploaded"

    # Anything changed breaks the signature: the path, the user, the operation, the
    # expiration; a forged one matches no sandbox.
    signed = sb.download_url("signed.txt", "user", 120)
    expires = urllib.parse.parse_qs(urllib.parse.urlsplit(signed).query)
    for bad in (_with(url, path="/etc/shadow"), _with(url, username="root"),
                _with(signed, signature_expiration=str(int(expires["signature_expiration"][0])
                                                       + 3600)),
                _with(url, signature="v1_" + "A" * 43), _with(url, signature="nonsense")):
        status, body = _get(bad)
        assert (status, json.loads(body)["message"]) == (401, "invalid signature"), bad
    assert _post(url, b"a read's signature does not write") == 401  # operation: read
    assert sb.files.read("signed.txt") == "for a browser"
    assert _get(_with(upload, path="up/loaded.txt"))[0] == 401  # a write's does not read

    # The domain mode (<port>-<id>.<domain> behind a proxy): the host names the sandbox,
    # the signature is still checked.
    import httpx2

    query = urllib.parse.urlsplit(url).query
    host = {"Host": f"49983-{sb.sandbox_id}.sbx.example.test"}
    assert httpx2.get(f"{e2b_gateway.url}/files?{query}", headers=host,
                      timeout=60).content == b"for a browser"
    forged = urllib.parse.urlsplit(_with(url, path="/etc/passwd")).query
    assert httpx2.get(f"{e2b_gateway.url}/files?{forged}", headers=host,
                      timeout=60).status_code == 401


def test_our_sdk_keeps_metadata_too(sb: Any, e2b_gateway: E2BGateway) -> None:
    from agent_sandbox.remote.provider import RemoteProvider
    from agent_sandbox.sdk import Sandbox

    ours = Sandbox.connect(sb.sandbox_id,
                           RemoteProvider(e2b_gateway.url, e2b_gateway.keys["a"]))
    ours.files.write("/home/user/ours.txt", "x", metadata={"Team": "blue"})
    assert ours.files.stat("/home/user/ours.txt").metadata == {"team": "blue"}
    assert sb.files.get_info("ours.txt").metadata == {"team": "blue"}
