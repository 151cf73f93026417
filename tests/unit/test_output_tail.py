"""The host's tail of a command's output stream (runtime/guest_streams.OutputTail): the
last ``cap`` bytes exactly, whatever the frames' sizes, held as the frames came."""

from __future__ import annotations

import random

import pytest

from agent_sandbox.guestlink.streams import OutputTail


@pytest.mark.parametrize("cap", [0, 1, 1000, 1 << 20])
def test_the_tail_is_the_last_cap_bytes(cap: int) -> None:
    rng = random.Random(cap)
    tail, whole = OutputTail(cap), bytearray()
    for _ in range(300):
        data = rng.randbytes(rng.choice([0, 1, 17, 4096, 65536, 1 << 20]))
        tail.add(data)
        whole += data
        assert tail.buf == bytes(whole[len(whole) - min(cap, len(whole)):])
        assert tail.size == len(tail.buf) <= cap
        assert tail.dropped == (len(whole) > cap)


def test_frames_are_kept_not_copied() -> None:
    tail = OutputTail(3 << 20)
    frames = [bytes([n]) * (1 << 20) for n in range(3)]
    for frame in frames:
        tail.add(frame)
    assert all(kept is frame for kept, frame in zip(tail.chunks, frames, strict=True))
    tail.add(b"x")
    assert len(tail.chunks) == 4 and tail.chunks[0] == frames[0][1:] and tail.dropped
