"""files.watch_dir on a real sandbox, on the embedded engine and through a gateway
(tests/sdk/conftest.py runs each test both ways)."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_sandbox import AsyncSandbox, Sandbox
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, SandboxError
from agent_sandbox.core.models import FilesystemEvent
from agent_sandbox.sdk import watch as sdk_watch
from agent_sandbox.sdk.watch import WatchHandle

pytestmark = pytest.mark.integration
WAIT = 10.0  # generous: events come within a second (bench/watch_latency.py measures)


def _until(handle: WatchHandle, kind: str, name: str) -> FilesystemEvent:
    deadline = time.monotonic() + WAIT
    while (left := deadline - time.monotonic()) > 0:
        event = handle.next_event(left)
        if event is not None and (event.type, event.name) == (kind, name):
            return event
    raise AssertionError(f"no {kind} event for {name} within {WAIT}s")


def test_watch_sees_create_modify_rename_delete(sandbox: Sandbox) -> None:
    run = sandbox.commands.run
    with sandbox.files.watch_dir("/workspace") as handle:
        assert handle.backend == "inotify"
        run("echo one > /workspace/a.txt")
        created = _until(handle, "create", "a.txt")
        assert created.path == "/workspace/a.txt" and not created.is_dir
        run("echo two >> /workspace/a.txt")
        _until(handle, "modify", "a.txt")
        run("mv /workspace/a.txt /workspace/b.txt")
        renamed = _until(handle, "rename", "b.txt")
        assert renamed.old_path == "/workspace/a.txt"
        run("rm /workspace/b.txt")
        _until(handle, "delete", "b.txt")
        sandbox.files.write("/workspace/c.txt", "via the SDK")  # atomic: temp, then rename
        assert _until(handle, "rename", "c.txt").old_path.startswith("/workspace/.c.txt.")
    assert handle.ended == "stopped" and handle.error is None


def test_recursive_watch_with_a_callback(sandbox: Sandbox) -> None:
    seen: list[FilesystemEvent] = []
    handle = sandbox.files.watch_dir("/workspace", recursive=True, on_event=seen.append)
    try:
        sandbox.commands.run("mkdir -p /workspace/x/y && echo hi > /workspace/x/y/z")
        deadline = time.monotonic() + WAIT
        while not any(e.name == "x/y/z" for e in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {("create", "x"), ("create", "x/y"), ("create", "x/y/z")} <= \
            {(e.type, e.name) for e in seen}
        with pytest.raises(InvalidArgumentError, match="on_event"):
            list(handle)
    finally:
        handle.stop()


def test_watch_ends_on_timeout_and_bad_requests_fail_early(sandbox: Sandbox) -> None:
    handle = sandbox.files.watch_dir("/workspace", timeout=0.5)
    assert list(handle) == [] and handle.ended == "timeout"
    with pytest.raises(NotFoundError):
        sandbox.files.watch_dir("/workspace/missing")
    sandbox.files.write("/workspace/file", "")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        sandbox.files.watch_dir("/workspace/file")
    with pytest.raises(InvalidArgumentError, match="relative"):
        sandbox.files.watch_dir("workspace")


def test_killing_the_sandbox_ends_the_watch_with_an_error(sandbox: Sandbox) -> None:
    handle = sandbox.files.watch_dir("/workspace")
    sandbox.kill(delete_volume=True)
    deadline = time.monotonic() + WAIT
    with pytest.raises(SandboxError):
        while time.monotonic() < deadline:
            handle.next_event(0.5)
    assert handle.ended == "failed" and handle.error is not None


def test_a_flood_stays_bounded_and_says_what_it_lost(sandbox: Sandbox,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_watch, "MAX_QUEUED_EVENTS", 500)
    with sandbox.files.watch_dir("/workspace") as handle:
        flood = sandbox.commands.run("cd /workspace && seq 1 30000 | xargs touch",
                                     timeout=120)
        assert flood.exit_code == 0, flood.stderr
        deadline = time.monotonic() + 60
        events: list[FilesystemEvent] = []
        marks = 0
        while not any(e.name.startswith("marker-") for e in events):
            assert time.monotonic() < deadline, f"{len(events)} events, no marker seen"
            assert len(handle._queue) <= 501
            new = handle.get_new_events()
            events += new
            if not new and any(e.type == "overflow" for e in events):
                # The flood is read: a change made now arrives (the kernel may have
                # dropped one made while its queue was full, so make one a second).
                sandbox.commands.run(f"touch /workspace/marker-{marks}")
                marks += 1
            time.sleep(0.2 if new else 1.0)
        assert any(e.type == "overflow" for e in events)
        assert len(events) < 2 * 30000


def test_async_watch_with_an_async_callback() -> None:
    async def scenario() -> list[str]:
        sb = await AsyncSandbox.create()
        try:
            names: list[str] = []

            async def on_event(event: FilesystemEvent) -> None:
                names.append(event.name)

            handle = await sb.files.watch_dir("/workspace", on_event=on_event)
            await sb.commands.run("touch /workspace/async-made")
            for _ in range(int(WAIT / 0.05)):
                if "async-made" in names:
                    break
                await asyncio.sleep(0.05)
            await handle.stop()
            iterated = await sb.files.watch_dir("/workspace", timeout=2)
            await sb.commands.run("touch /workspace/again")
            names += [e.name async for e in iterated]
            return names
        finally:
            await sb.kill(delete_volume=True)

    names = asyncio.run(scenario())
    assert "async-made" in names and "again" in names
