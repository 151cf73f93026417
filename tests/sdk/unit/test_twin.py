"""The async twin generator on a small sync class: concurrent calls, callbacks of both
kinds, iterators as async iterators, awaited ``@asks_provider`` properties."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agent_sandbox.sdk import twin as twin_module
from agent_sandbox.sdk.twin import AsyncTwin, asks_provider, async_twin_of


class Counter:
    def __init__(self, start: int) -> None:
        self.start = start
        self.asked = 0

    @property
    @asks_provider
    def fresh(self) -> int:
        self.asked += 1
        return self.start + self.asked

    @property
    def label(self) -> str:
        return f"counter {self.start}"

    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return threading.current_thread().name

    def count(self, upto: int, on_stdout: Callable[[str], None] | None = None) -> int:
        for i in range(upto):
            if on_stdout:
                on_stdout(str(i))
        return upto

    def meet(self, barrier: threading.Barrier) -> int:
        return barrier.wait()  # BrokenBarrierError unless all parties run at once

    def chunks(self) -> Iterator[bytes]:
        yield from (b"a", b"b")

    def child(self) -> Counter:
        return Counter(self.start + 1)


@async_twin_of(Counter)
class AsyncCounter(AsyncTwin):
    pass


def test_calls_run_concurrently_off_the_loop() -> None:
    async def main() -> tuple[float, list[str]]:
        twin = AsyncCounter(0)
        began = time.monotonic()
        names = await asyncio.gather(*(twin.slow(0.3) for _ in range(4)))
        return time.monotonic() - began, names

    elapsed, names = asyncio.run(main())
    assert elapsed < 0.9  # serialized would take 1.2 s
    assert threading.main_thread().name not in names


def test_callbacks_plain_or_coroutine_and_conversions() -> None:
    async def main() -> None:
        twin = AsyncCounter(5)
        plain: list[str] = []
        awaited: list[str] = []

        async def on_async(text: str) -> None:
            awaited.append(text)

        assert await twin.count(3, plain.append) == 3 and plain == ["0", "1", "2"]
        assert await twin.count(2, on_stdout=on_async) == 2 and awaited == ["0", "1"]
        assert [c async for c in await twin.chunks()] == [b"a", b"b"]
        child = await twin.child()
        assert isinstance(child, AsyncCounter) and child.start == 6
        assert twin.label == "counter 5" and repr(twin).startswith("Async<")
        assert await twin.fresh == 6 and await twin.fresh == 7  # asked each time
        with pytest.raises(TypeError, match="upto"):
            await twin.count()

    asyncio.run(main())


def test_more_calls_at_once_than_the_default_executor_allows() -> None:
    """asyncio.to_thread's pool has CPUs + 4 threads; the SDK's has 64 (set_max_threads):
    a barrier of CPUs + 5 parties is passed only if every call runs at the same time."""
    parties = min(twin_module.DEFAULT_MAX_THREADS, (os.cpu_count() or 1) + 5)

    async def main(n: int) -> list[int]:
        barrier = threading.Barrier(n, timeout=30)
        twin = AsyncCounter(0)
        return await asyncio.gather(*(twin.meet(barrier) for _ in range(n)))

    assert twin_module.max_threads() == twin_module.DEFAULT_MAX_THREADS
    assert sorted(asyncio.run(main(parties))) == list(range(parties))
    twin_module.set_max_threads(parties + 10)
    try:
        assert twin_module.max_threads() == parties + 10
        assert sorted(asyncio.run(main(parties + 10))) == list(range(parties + 10))
    finally:
        twin_module.set_max_threads(twin_module.DEFAULT_MAX_THREADS)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            twin_module.set_max_threads(bad)  # type: ignore[arg-type]
