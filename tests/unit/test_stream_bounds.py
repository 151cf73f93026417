"""What the gateway holds of a stream it relays, in-process: its event queue is bounded
by the bytes the events carry (surfaces/http/event_queue.py), and an envd process stream's
events carry at most 64 KiB of output each, cut between UTF-8 characters
(surfaces/e2b/envd/proc_events.py); a client that does not read makes the work wait."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import pytest

from agent_sandbox.surfaces.e2b.envd import proc_events as ev
from agent_sandbox.surfaces.http import streaming
from agent_sandbox.surfaces.http.event_queue import MAX_BYTES, EventQueue, event_size
from agent_sandbox.surfaces.http.streaming import Emit

KiB = 1 << 10


def test_the_queue_is_bounded_by_bytes_not_only_by_count() -> None:
    q = EventQueue(max_events=32, max_bytes=256 * KiB)
    for _ in range(4):
        q.put({"stdout": b"x" * (64 * KiB)}, timeout=0)
    assert q.held == 256 * KiB
    with pytest.raises(queue.Full):
        q.put({"stdout": b"x"}, timeout=0.05)  # four events, yet full
    q.put({"pid": 7}, timeout=0)  # carries no output: room by count
    assert q.get() == {"stdout": b"x" * (64 * KiB)}
    q.put({"stdout": "y" * (64 * KiB)}, timeout=0)  # text counts too
    assert q.qsize() == 5


def test_the_queue_is_bounded_by_count() -> None:
    q = EventQueue(max_events=2, max_bytes=1 << 20)
    q.put({"pid": 1}, timeout=0)
    q.put(None, timeout=0)
    with pytest.raises(queue.Full):
        q.put_nowait({"pid": 2})


def test_an_event_larger_than_the_bound_goes_alone_and_waits_for_room() -> None:
    q = EventQueue(max_events=32, max_bytes=64 * KiB)
    big = {"stdout": b"x" * (1 << 20)}
    q.put(big, timeout=0)  # an empty queue takes it: nothing waits forever
    with pytest.raises(queue.Full):
        q.put({"stdout": b"y"}, timeout=0.05)
    taken: list[Any] = []
    threading.Timer(0.1, lambda: taken.append(q.get())).start()
    started = time.monotonic()
    q.put({"stdout": b"y"}, timeout=5)  # once the consumer took the big one
    assert taken == [big] and time.monotonic() - started >= 0.05
    assert q.held == 1 and event_size({"stdout": b"y", "n": 3}) == 1


@pytest.mark.parametrize("text", ["a" * 300_000, "é" * 100_000, "€a😀" * 30_000, "x"])
def test_output_events_are_at_most_64_kib_of_whole_characters(text: str) -> None:
    events: list[dict[str, Any]] = []
    ev._emit_text(events.append, "stdout", text)
    pieces = [e["stdout"] for e in events]
    assert all(0 < len(p) <= ev.DATA_MAX for p in pieces)
    assert "".join(p.decode() for p in pieces) == text  # each decodes on its own


def test_bytes_that_are_not_utf8_are_cut_at_the_bound() -> None:
    data = b"\x80" * 200_000  # continuation bytes only: no character boundary anywhere
    pieces = list(ev.pieces(data))
    assert b"".join(pieces) == data
    assert [len(p) for p in pieces[:-1]] == [ev.DATA_MAX] * (len(pieces) - 1)


def test_an_unread_process_stream_holds_a_bounded_amount(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames of 1 MiB from the sandbox, a client that reads nothing: what the stream
    holds stays within the queue's bound; the work waits (as the sandbox then does)."""
    queues: list[EventQueue] = []

    class Recorded(EventQueue):
        def __init__(self) -> None:
            super().__init__()
            queues.append(self)

    monkeypatch.setattr(streaming, "EventQueue", Recorded)
    emitted = threading.Event()
    sent = []

    def work(emit: Emit) -> dict[str, Any]:
        for _ in range(8):
            ev._emit_text(emit, "stdout", "z" * (1 << 20))
            sent.append(1)
        emitted.set()
        return {"end": 0}

    async def main() -> None:
        stream = ev.events(work, interval=30).__aiter__()
        first = await stream.__anext__()
        assert len(first.event.value.output.value) == ev.DATA_MAX
        await asyncio.sleep(0.5)  # the client stops reading
        assert not emitted.is_set() and not sent  # the work waits for it
        assert 0 < queues[0].held <= MAX_BYTES
        await stream.aclose()

    asyncio.run(main())
