"""AsyncSandbox: the same operations from asyncio, callbacks sync or async."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox import AsyncSandbox

pytestmark = pytest.mark.integration


def test_async_sandbox_end_to_end() -> None:
    async def scenario() -> None:
        sb = await AsyncSandbox.create(envs={"WHO": "async"})
        try:
            seen: list[str] = []

            async def on_out(text: str) -> None:
                seen.append(text)

            result = await sb.commands.run("echo $WHO; sleep 0.1; echo again",
                                           on_stdout=on_out)
            assert result.stdout == "async\nagain\n"
            assert "".join(seen) == result.stdout

            await sb.files.write("/workspace/x.txt", "data")
            assert await sb.files.read("/workspace/x.txt") == "data"
            chunks = [c async for c in await sb.files.read("/workspace/x.txt", format="stream")]
            assert b"".join(chunks) == b"data"
            assert [e.name for e in await sb.files.list("/workspace")] == ["x.txt"]

            handle = await sb.commands.run("sleep 30", background=True)
            assert handle.pid in {p.pid for p in await sb.commands.list()}
            assert await handle.kill()

            # A command started earlier, taken up again (it was missing from the async API).
            talker = await sb.commands.run("echo hi; sleep 0.2; echo bye", background=True)
            tail: list[str] = []

            async def on_tail(text: str) -> None:
                tail.append(text)

            again_handle = await sb.commands.connect(talker.pid)
            done = await again_handle.wait(on_stdout=on_tail)
            assert done.exit_code == 0 and "".join(tail).endswith("bye\n")

            # Concurrent calls do not serialize on the event loop.
            results = await asyncio.gather(*(sb.commands.run(f"echo {i}") for i in range(8)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]

            await sb.pause()
            assert (await sb.info()).state == "paused"
            assert await sb.state == "paused"  # asked afresh, as Sandbox.state is
            await sb.resume()
            assert await sb.state == "running"
            again = await AsyncSandbox.connect(sb.sandbox_id)
            assert again.template == "base"
            assert sb.sandbox_id in {s.sandbox_id for s in await AsyncSandbox.list()}
        finally:
            await sb.kill(delete_volume=True)

    asyncio.run(scenario())
