"""envd's filesystem through the real e2b SDK: ``files.write`` / ``read`` (text, bytes,
stream; multipart and octet-stream uploads, 50 MB byte-exact without the gateway holding
it), ``list`` (depth), ``exists``, ``make_dir``, ``rename``, ``remove``, ``get_info``,
``watch_dir`` (the sync SDK's polling watcher and the async SDK's stream), the SDK's
exceptions for missing paths, and a symlink out of the sandbox's tree resolving inside it."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


def _until(check: Any, what: str, seconds: float = 20) -> Any:
    """Poll ``check`` until it returns something truthy (events arrive asynchronously)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_write_and_read_every_way(e2b_sandbox: Any) -> None:
    from e2b import FileType
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    files = e2b_sandbox.files
    info = files.write("hello.txt", "héllo\n")  # str, relative: the user's home
    assert (info.name, info.type, info.path) == ("hello.txt", FileType.FILE,
                                                 "/home/user/hello.txt")
    assert files.read("/home/user/hello.txt") == "héllo\n"
    assert files.read("~/hello.txt", format="bytes") == bytearray("héllo\n".encode())

    blob = bytes(range(256)) * 1000
    files.write("/tmp/deep/er/blob.bin", blob)  # bytes; the directories are made
    with files.read("/tmp/deep/er/blob.bin", format="stream") as stream:
        assert b"".join(stream) == blob

    # Several files in one multipart body, each part named by its path.
    written = files.write_files([WriteEntry(path="multi/a.txt", data="A"),
                                 WriteEntry(path="/tmp/multi-b.bin", data=b"\x00B")])
    assert [w.path for w in written] == ["/home/user/multi/a.txt", "/tmp/multi-b.bin"]
    assert files.read("multi/a.txt") == "A"
    assert files.read("/tmp/multi-b.bin", format="bytes") == bytearray(b"\x00B")

    # A file-like object goes as an application/octet-stream body; gzip too.
    files.write("/tmp/raw.txt", io.BytesIO(b"raw body"))
    assert files.read("/tmp/raw.txt") == "raw body"
    files.write("/tmp/gz.txt", b"z" * 100_000, gzip=True)
    assert files.read("/tmp/gz.txt", format="bytes") == bytearray(b"z" * 100_000)
    files.write("/tmp/raw.txt", b"replaced", use_octet_stream=True)
    assert files.read("/tmp/raw.txt") == "replaced"


def test_missing_paths_raise_the_sdk_exceptions(e2b_sandbox: Any) -> None:
    from e2b import FileNotFoundException, InvalidArgumentException, NotFoundException

    files = e2b_sandbox.files
    with pytest.raises(NotFoundException, match="no such file"):
        files.read("/no/such/file.txt")
    with pytest.raises(NotFoundException):
        files.read("no-such-file.txt", format="stream")
    with pytest.raises(FileNotFoundException):
        files.get_info("/no/such/thing")
    with pytest.raises(FileNotFoundException):
        files.list("/no/such/dir")
    with pytest.raises(FileNotFoundException):
        files.rename("/no/such/a", "/tmp/b")
    files.remove("/no/such/thing")  # as envd: removing nothing is no error
    with pytest.raises(InvalidArgumentException, match="not a regular file"):
        files.read("/tmp")  # a directory


def test_dirs_list_info_rename_remove(e2b_sandbox: Any) -> None:
    from e2b import FileType

    files = e2b_sandbox.files
    top = f"dir-{uuid.uuid4().hex[:8]}"
    assert files.make_dir(f"{top}/sub/deeper") is True  # with its parents
    assert files.make_dir(f"{top}/sub") is False  # exists already
    files.write(f"{top}/file.txt", "four")

    listed = files.list(top)
    assert [(e.name, e.type, e.path) for e in listed] == [
        ("file.txt", FileType.FILE, f"/home/user/{top}/file.txt"),
        ("sub", FileType.DIR, f"/home/user/{top}/sub")]
    deep = files.list(f"/home/user/{top}", depth=3)
    assert sorted(e.path.removeprefix(f"/home/user/{top}/") for e in deep) == [
        "file.txt", "sub", "sub/deeper"]

    assert files.exists(f"{top}/file.txt") and not files.exists(f"{top}/nope")
    info = files.get_info(f"{top}/file.txt")
    assert (info.name, info.type, info.size) == ("file.txt", FileType.FILE, 4)
    assert (info.mode, info.permissions) == (0o644, "-rw-r--r--")
    assert abs(info.modified_time.timestamp() - time.time()) < 300  # the sandbox's clock
    assert info.modified_time.tzinfo is not None
    d = files.get_info(f"{top}/sub")
    assert (d.type, d.permissions[0]) == (FileType.DIR, "d")

    moved = files.rename(f"{top}/file.txt", f"{top}/sub/moved.txt")
    assert (moved.name, moved.path) == ("moved.txt", f"/home/user/{top}/sub/moved.txt")
    assert not files.exists(f"{top}/file.txt")
    assert files.read(f"{top}/sub/moved.txt") == "four"

    files.remove(top)  # recursive
    assert not files.exists(top)


def test_watch_dir_polling(e2b_sandbox: Any) -> None:
    """The sync SDK's watch_dir: CreateWatcher, then GetWatcherEvents polls."""
    from e2b import FileNotFoundException, FilesystemEventType, SandboxException

    files = e2b_sandbox.files
    files.make_dir("watched/nested")
    handle = files.watch_dir("watched")
    files.write("watched/w.txt", "one")  # through a temporary file, renamed onto w.txt
    files.write("watched/nested/not-seen.txt", "not recursive")
    files.rename("watched/w.txt", "watched/renamed.txt")
    files.remove("watched/renamed.txt")
    seen: list[tuple[FilesystemEventType, str]] = []

    def removed() -> bool:
        seen.extend((e.type, e.name) for e in handle.get_new_events())
        return (FilesystemEventType.REMOVE, "renamed.txt") in seen

    _until(removed, "the remove event")
    assert (FilesystemEventType.CREATE, "w.txt") in seen
    assert (FilesystemEventType.WRITE, "w.txt") in seen
    assert (FilesystemEventType.RENAME, "w.txt") in seen
    assert (FilesystemEventType.CREATE, "renamed.txt") in seen
    assert not [n for _, n in seen if ".abx" in n or "not-seen" in n], seen
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()

    recursive = files.watch_dir("watched", recursive=True)
    files.write("watched/nested/seen.txt", "deep")
    _until(lambda: (FilesystemEventType.WRITE, "nested/seen.txt") in [
        (e.type, e.name) for e in recursive.get_new_events()], "the nested write")
    recursive.stop()

    with pytest.raises(FileNotFoundException):
        files.watch_dir("no-such-dir")


def test_watch_dir_stream(e2b_env: E2BGateway) -> None:
    """The async SDK's watch_dir: the WatchDir server stream."""
    from e2b import AsyncSandbox, FilesystemEventType

    async def main() -> list[tuple[Any, str]]:
        sb = await AsyncSandbox.create()
        try:
            await sb.files.make_dir("/tmp/stream-watch")
            events: list[tuple[Any, str]] = []
            handle = await sb.files.watch_dir(
                "/tmp/stream-watch", on_event=lambda e: events.append((e.type, e.name)))
            await sb.files.write("/tmp/stream-watch/s.txt", "x")
            deadline = time.monotonic() + 20
            while (FilesystemEventType.WRITE, "s.txt") not in events:
                assert time.monotonic() < deadline, events
                await asyncio.sleep(0.1)
            await handle.stop()
            return events
        finally:
            await sb.kill()

    events = asyncio.run(main())
    assert (FilesystemEventType.CREATE, "s.txt") in events


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_50mb_upload_is_streamed_and_byte_exact(e2b_gateway: E2BGateway,
                                                e2b_sandbox: Any) -> None:
    size = 50 << 20
    data = os.urandom(1 << 20) * 50
    digest = hashlib.sha256(data).hexdigest()
    assert e2b_gateway.proc.proc is not None
    pid = e2b_gateway.proc.proc.pid
    before = _peak_rss(pid)

    files = e2b_sandbox.files
    files.write("/tmp/big-raw.bin", io.BytesIO(data))  # octet-stream, streamed
    files.write("/tmp/big-multipart.bin", data)  # bytes: one multipart part
    for path in ("/tmp/big-raw.bin", "/tmp/big-multipart.bin"):
        assert files.get_info(path).size == size
        sha = hashlib.sha256()
        with files.read(path, format="stream") as stream:
            for chunk in stream:
                sha.update(chunk)
        assert sha.hexdigest() == digest

    # Neither upload nor download was held whole: the gateway's peak grew by far less
    # than one copy of the file.
    assert _peak_rss(pid) - before < size // 2, (before, _peak_rss(pid))


def test_symlink_out_of_the_tree_resolves_in_the_sandbox(e2b_gateway: E2BGateway,
                                                         e2b_sandbox: Any) -> None:
    from e2b import FileType

    from agent_sandbox.remote.provider import RemoteProvider

    # Made with the gateway's own API (the Process service is another part of the work).
    ours = RemoteProvider(e2b_gateway.url, e2b_gateway.keys["a"], retry_seconds=5)
    marker = f"only in the sandbox {uuid.uuid4()}"
    e2b_sandbox.files.write("/etc/abx-marker", marker)
    result = ours.run(e2b_sandbox.sandbox_id,
                      "ln -s /etc/abx-marker /tmp/to-marker && ln -s /etc/shadow /tmp/x && "
                      "ln -s ../etc /tmp/up && ln -s up/abx-marker /tmp/chain && "
                      "ln -s loop2 /tmp/loop1 && ln -s loop1 /tmp/loop2 && "
                      "ln -s /no/such /tmp/dangling")
    assert result.exit_code == 0, result.stderr

    files = e2b_sandbox.files
    assert files.read("/tmp/to-marker") == marker  # not a host path
    assert not Path("/etc/abx-marker").exists()
    # envd >= 0.6: a symlink is an entry of its target's type, with the path it resolves
    # to (in the sandbox's tree, a chain followed); one that dangles or loops: its own
    # path, type unspecified.
    link = files.get_info("/tmp/x")
    assert (link.type, link.symlink_target) == (FileType.FILE, "/etc/shadow")
    assert (files.get_info("/tmp/up").type, files.get_info("/tmp/up").symlink_target) == (
        FileType.DIR, "/etc")
    assert files.get_info("/tmp/chain").symlink_target == "/etc/abx-marker"
    for name in ("loop1", "dangling"):
        info = files.get_info(f"/tmp/{name}")
        assert (info.type, info.symlink_target) == (None, f"/tmp/{name}")
    listed = {e.name: e for e in files.list("/tmp")}  # (the SDK leaves untyped ones out)
    assert (listed["chain"].type, listed["chain"].size) == (FileType.FILE,
                                                             len("up/abx-marker"))
    shadow = files.read("/tmp/x")
    assert shadow == files.read("/etc/shadow")
    files.write("/tmp/x", "replaced")  # replaces the link, in the sandbox
    assert files.read("/tmp/x") == "replaced"
    assert files.read("/etc/shadow") == shadow


def _raw(gateway: E2BGateway, sb: Any) -> Any:
    """A plain HTTP client addressed as the SDK addresses envd (single-URL mode)."""
    import httpx2

    return httpx2.Client(base_url=gateway.url, timeout=60, headers={
        "E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sb._envd_access_token})


def test_bad_file_requests_get_envd_errors(e2b_gateway: E2BGateway, e2b_sandbox: Any) -> None:
    with _raw(e2b_gateway, e2b_sandbox) as http:
        missing = http.get("/files", params={"path": "/nope.txt"})
        assert missing.status_code == 404
        assert missing.json() == {"code": 404, "message": "/nope.txt: no such file or "
                                                          "directory"}
        assert http.get("/files").json()["message"].startswith("the 'path' query parameter")
        assert http.get("/files", params={"path": "a", "username": "../x"}).status_code == 400
        wrong = http.post("/files", params={"path": "/tmp/x"}, content=b"x",
                          headers={"Content-Type": "text/plain"})
        assert wrong.status_code == 415 and "octet-stream" in wrong.json()["message"]
        form = {"Content-Type": "multipart/form-data; boundary=BB"}
        cut = http.post("/files", content=b"--BB\r\nContent-Disposition: form-data; "
                        b'name="file"; filename="/tmp/cut.txt"\r\n\r\npartial', headers=form)
        assert cut.status_code == 400 and "ended" in cut.json()["message"]
        junk = http.post("/files", content=b"not multipart at all", headers=form)
        assert junk.status_code == 400
        nameless = http.post("/files", content=b"--BB\r\nContent-Disposition: form-data; "
                             b'name="file"\r\n\r\ndata\r\n--BB--\r\n', headers=form)
        assert nameless.status_code == 400 and "filename" in nameless.json()["message"]
        bomb = http.post("/files", params={"path": "/tmp/gz"}, content=b"\x1f\x8bnot gzip",
                         headers={"Content-Type": "application/octet-stream",
                                  "Content-Encoding": "gzip"})
        assert bomb.status_code == 400 and "gzip" in bomb.json()["message"]
        # A multipart body of two files (the JS SDK's shape), names as UTF-8.
        two = http.post("/files", content=(
            "--BB\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/ü.txt\""
            "\r\n\r\nuu\r\n--BB\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\n"
            "ignored\r\n--BB\r\nContent-Disposition: form-data; name=\"file\"; "
            "filename=\"rel.txt\"\r\n\r\nrr\r\n--BB--\r\n").encode(), headers=form)
        assert two.status_code == 200, two.text
        assert two.json() == [{"name": "ü.txt", "type": "file", "path": "/tmp/ü.txt"},
                              {"name": "rel.txt", "type": "file",
                               "path": "/home/user/rel.txt"}]
    assert e2b_sandbox.files.read("/tmp/ü.txt") == "uu"
    assert e2b_sandbox.files.read("rel.txt", user="user") == "rr"
    assert e2b_sandbox.files.get_info("~", user="root").path == "/root"


def test_watchers_belong_to_their_sandbox(e2b_gateway: E2BGateway, e2b_sandbox: Any) -> None:
    from e2b import Sandbox

    handle = e2b_sandbox.files.watch_dir("/tmp")
    other = Sandbox.create()
    try:
        with _raw(e2b_gateway, other) as http:
            stolen = http.post("/filesystem.Filesystem/GetWatcherEvents",
                               json={"watcherId": handle._watcher_id})
            assert stolen.status_code == 404 and stolen.json()["code"] == "not_found"
        with _raw(e2b_gateway, e2b_sandbox) as http:
            mine = http.post("/filesystem.Filesystem/GetWatcherEvents",
                             json={"watcherId": handle._watcher_id})
            assert mine.status_code == 200, mine.text
    finally:
        other.kill()
    handle.stop()
    with _raw(e2b_gateway, e2b_sandbox) as http:
        gone = http.post("/filesystem.Filesystem/GetWatcherEvents",
                         json={"watcherId": handle._watcher_id})
        assert gone.status_code == 404 and "stopped" in gone.json()["message"]


def test_watchers_are_bounded(e2b_sandbox: Any) -> None:
    """Each polling watcher holds a watch in the sandbox (the guest allows
    WATCH_ACTIVE_MAX) and one of the key's slots: more is a clear error, and a stopped
    one gives both back."""
    from e2b import RateLimitException

    from agent_sandbox.guest.limits import WATCH_ACTIVE_MAX

    files = e2b_sandbox.files
    handles = [files.watch_dir("/tmp") for _ in range(WATCH_ACTIVE_MAX)]
    with pytest.raises(RateLimitException, match="watched already"):
        files.watch_dir("/tmp")
    for handle in handles:
        handle.stop()

    def again() -> Any:  # a stopped watch ends in the sandbox a moment later
        try:
            return files.watch_dir("/tmp")
        except RateLimitException:
            return None

    _until(again, "a free watch").stop()


def test_a_locked_file_answers_e2b_writers_with_retry_later(e2b_gateway: E2BGateway,
                                                            e2b_sandbox: Any) -> None:
    """Issue 29: E2B's /files and envd's filesystem service meet the guest's locks too."""
    import httpx2 as httpx
    from e2b.exceptions import SandboxException

    path = "/home/user/locked.txt"
    e2b_sandbox.files.write(path, "before")
    base = f"{e2b_gateway.url}/v1/sandboxes/{e2b_sandbox.sandbox_id}/files"
    auth = {"Authorization": f"Bearer {e2b_gateway.keys['a']}"}
    held = httpx.post(f"{base}/lock", json={"path": path, "ttl": 30}, headers=auth)
    assert held.status_code == 200, held.text
    with pytest.raises(SandboxException, match="locked by a: rest"):
        e2b_sandbox.files.write(path, "not now")
    with pytest.raises(SandboxException, match="locked by a: rest"):
        e2b_sandbox.files.remove(path)
    token = held.json()["token"]
    assert httpx.post(f"{base}/unlock", json={"path": path, "token": token},
                      headers=auth).status_code == 204
    e2b_sandbox.files.write(path, "after")
    assert e2b_sandbox.files.read(path) == "after"
