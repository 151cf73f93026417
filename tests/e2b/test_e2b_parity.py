"""E2B's behaviours the SDKs and E2B's own tests rely on, through the real e2b SDK: the
listing's filters, order and pages; a paused sandbox is not running and ``connect()``
resumes it; ``connect(timeout=...)`` never shortens a sandbox's time; metrics (and key B
cannot read key A's). Two sandboxes, shared by the tests of this module."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair(e2b_gateway: E2BGateway) -> Iterator[tuple[Any, Any, str]]:
    """(older, newer, tag): two sandboxes of key A, tagged in their metadata."""
    from e2b import Sandbox

    tag = uuid.uuid4().hex
    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_gateway.env("a").items():
            mp.setenv(name, value)
        older = Sandbox.create(metadata={"parity": tag}, timeout=300)
        time.sleep(0.01)  # distinct start times, whatever the clock's grain
        newer = Sandbox.create(metadata={"parity": tag}, timeout=300)
        try:
            yield older, newer, tag
        finally:
            for sb in (older, newer):
                e2b_gateway.kill_sandbox(sb.sandbox_id)


def _ids(paginator: Any) -> list[str]:
    found: list[str] = []
    while paginator.has_next:
        found += [s.sandbox_id for s in paginator.next_items()]
    return found


def test_list_filters_orders_and_pages(e2b_env: E2BGateway, pair: tuple[Any, Any, str]
                                       ) -> None:
    from e2b import Sandbox, SandboxQuery

    older, newer, tag = pair
    mine = {"parity": tag}
    # Newest first unless asked, across pages of one.
    paginator = Sandbox.list(query=SandboxQuery(metadata=mine), limit=1)
    assert [s.sandbox_id for s in paginator.next_items()] == [newer.sandbox_id]
    assert paginator.has_next and paginator.next_token
    assert [s.sandbox_id for s in paginator.next_items()] == [older.sandbox_id]
    assert not paginator.has_next and paginator.next_token is None
    assert _ids(Sandbox.list(query=SandboxQuery(metadata=mine), limit=1, order="asc")) == \
        [older.sandbox_id, newer.sandbox_id]
    since = newer.get_info().started_at
    assert _ids(Sandbox.list(query=SandboxQuery(metadata=mine, started_after=since))) == \
        [newer.sandbox_id]
    assert _ids(Sandbox.list(query=SandboxQuery(metadata=mine, template="base"))) == \
        [newer.sandbox_id, older.sandbox_id]
    assert _ids(Sandbox.list(query=SandboxQuery(metadata=mine,
                                                template="code-interpreter-v1"))) == []


def test_connect_never_shortens_and_paused_is_not_running(
        e2b_env: E2BGateway, pair: tuple[Any, Any, str]) -> None:
    from e2b import Sandbox

    older = pair[0]
    ends = older.get_info().end_at
    Sandbox.connect(older.sandbox_id, timeout=10)
    assert older.get_info().end_at >= ends  # E2B only ever extends it
    Sandbox.connect(older.sandbox_id, timeout=900)
    assert (older.get_info().end_at - ends).total_seconds() > 500
    older.pause()
    assert older.is_running() is False  # envd answers 502 for a sandbox not running
    again = Sandbox.connect(older.sandbox_id)
    assert again.is_running() is True and older.is_running() is True


def test_metrics_over_time_and_only_for_the_owner(e2b_env: E2BGateway,
                                                  pair: tuple[Any, Any, str]) -> None:
    import httpx2 as httpx

    newer = pair[1]
    newer.commands.run("head -c 20000000 /dev/zero > /tmp/fill; sleep 1.1")
    first = newer.get_metrics()
    assert first, "a running sandbox has a sample"
    sample = first[-1]
    assert sample.cpu_count >= 1 and 0 <= sample.cpu_used_pct <= 100
    assert 0 < sample.mem_used <= sample.mem_total and sample.mem_cache <= sample.mem_used
    assert 0 < sample.disk_used <= sample.disk_total
    time.sleep(1.1)
    later = newer.get_metrics(start=sample.timestamp)
    assert len(later) == 2 and later[0].timestamp == sample.timestamp
    url = f"{e2b_env.url}/sandboxes/{newer.sandbox_id}/metrics"
    assert httpx.get(url, headers={"X-API-KEY": e2b_env.keys["b"]}).status_code == 404
    many = httpx.get(f"{e2b_env.url}/sandboxes/metrics",
                     params={"sandbox_ids": f"{newer.sandbox_id},sbx-nope"},
                     headers={"X-API-KEY": e2b_env.keys["a"]}).json()
    assert list(many["sandboxes"]) == [newer.sandbox_id]
    theirs = httpx.get(f"{e2b_env.url}/sandboxes/metrics",
                       params={"sandbox_ids": newer.sandbox_id},
                       headers={"X-API-KEY": e2b_env.keys["b"]}).json()
    assert theirs == {"sandboxes": {}}
    ours = f"{e2b_env.url}/v1/sandboxes/{newer.sandbox_id}/metrics"
    mine = httpx.get(ours, headers={"Authorization": f"Bearer {e2b_env.keys['a']}"})
    assert mine.status_code == 200
    assert abs(mine.json()[0]["timestamp"] - sample.timestamp.timestamp()) < 1e-3
    other = httpx.get(ours, headers={"Authorization": f"Bearer {e2b_env.keys['b']}"})
    assert other.status_code == 404


def test_files_as_envd_reports_them(e2b_env: E2BGateway) -> None:
    """On a fresh ``secure=True`` sandbox: its home can be watched before anything used it;
    a new file is seen as CREATE, CHMOD, WRITE and a rewrite as WRITE; entries carry their
    owner's and group's names; a listing of depth 2 is depth-first."""
    from e2b import FilesystemEventType as T
    from e2b import Sandbox

    sb = Sandbox.create(secure=True)
    try:
        handle = sb.files.watch_dir("/home/user")
        sb.files.write("new.txt", "one")
        assert [(e.type, e.name) for e in handle.get_new_events()] == \
            [(T.CREATE, "new.txt"), (T.CHMOD, "new.txt"), (T.WRITE, "new.txt")]
        sb.files.write("new.txt", "two")
        assert [(e.type, e.name) for e in handle.get_new_events()] == [(T.WRITE, "new.txt")]
        handle.stop()
        info = sb.files.get_info("new.txt")
        assert (info.owner, info.group) == ("user", "user")
        assert (sb.files.get_info("/etc/hostname").owner) == "root"
        for path in ("tree/a/x", "tree/b/y"):
            sb.files.write(path, "")
        sb.files.write("tree/c", "")
        listed = [e.path.removeprefix("/home/user/tree/") for e in sb.files.list("tree", depth=2)]
        assert listed == ["a", "a/x", "b", "b/y", "c"]
    finally:
        e2b_env.kill_sandbox(sb.sandbox_id)


def test_a_killed_sandbox_and_a_command_past_its_timeout(e2b_env: E2BGateway,
                                                          code_template: str) -> None:
    """A DataFrame's result has E2B's ``data``, a saved image is displayed. A command
    waited on while its sandbox is
    killed, and a cell running when it is,
    raise E2B's TimeoutException (the SDKs probe the sandbox and say it was killed); the
    async SDK's command past its ``timeout`` raises TimeoutException, not the kill's 137."""
    import asyncio
    import threading

    from e2b import AsyncSandbox, Sandbox, TimeoutException
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sb = Sandbox.create()
    cmd = sb.commands.run("sleep 60", background=True)
    sb.kill()
    with pytest.raises(TimeoutException, match="killed or reached its end of life"):
        cmd.wait()

    code = CodeSandbox.create()
    # A DataFrame's columns are its result's data, as E2B's template gives them; the
    # formatter's setup leaves no name behind.
    frame = code.run_code("import pandas as pd; pd.DataFrame({'a': [1, None], "
                          "'t': pd.to_datetime(['2024-01-02', '2024-01-03'])})")
    assert frame.results[0].data == {"a": [1.0, None],
                                     "t": ["2024-01-02T00:00:00", "2024-01-03T00:00:00"]}
    assert code.run_code("'_abx_setup' in dir()").text == "False"
    # Hidden cells (home, envs) are not counted; a Pillow image saved is displayed.
    assert frame.execution_count == 1
    saved = code.run_code("from PIL import Image; Image.new('RGB', (4, 4)).save('/tmp/i.png')",
                          envs={"ANY": "1"})
    assert saved.execution_count == 3 and saved.results and saved.results[0].png
    assert code.run_code("print('x')", envs={"ANY": "2"}).logs.stdout == ["x\n"]
    killer = threading.Timer(1.5, code.kill)
    killer.start()
    try:
        with pytest.raises(TimeoutException, match="killed"):
            code.run_code("import time; time.sleep(30)")
    finally:
        killer.join()

    async def timed_out() -> None:
        sbx = await AsyncSandbox.create()
        try:
            for _ in range(2):
                with pytest.raises(TimeoutException):
                    await sbx.commands.run("sleep 10", timeout=1)
        finally:
            await sbx.kill()

    asyncio.run(timed_out())
