"""The host's guest client against a guest that lies: every answer is hostile input.

A real sandbox can no longer replace its guest (it runs from read-only host views), so
the lying guest here is a socket server speaking the real framing with forged replies.
Each case must end in bounded time and memory with ``GuestProtocolError`` or a timeout,
never a pinned thread or a grown host process.
"""

from __future__ import annotations

import resource
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lyingguest import Reply, lying_guests

from agent_sandbox.core.cancel import CallCancel
from agent_sandbox.core.errors import (
    CancelledCallError,
    NotFoundError,
    SandboxError,
    SandboxTimeoutError,
)
from agent_sandbox.guest import protocol as proto
from agent_sandbox.guestlink import client as guest_client
from agent_sandbox.guestlink.channel import GuestUnavailableError
from agent_sandbox.guestlink.client import GuestClient, GuestProtocolError

pytestmark = pytest.mark.integration


@pytest.fixture
def liar() -> Iterator[Callable[[Reply], str]]:
    """liar(reply) -> socket path of a 'guest' answering every request with reply()."""
    with lying_guests() as start:
        yield start


def _within(seconds: float, fn: Callable[[], object]) -> BaseException | None:
    """Run fn; return what it raised. Fails the test if it takes longer than seconds."""
    box: dict[str, BaseException] = {}

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            box["exc"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the host call was pinned for more than {seconds} s"
    return box.get("exc")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _endless(frame: dict, payload: bytes = b"", pause: float = 0.0,
             limit_bytes: int = 600 << 20, limit_s: float = 20.0) -> Reply:
    def reply(conn: socket.socket, req: dict) -> None:
        sent, start = 0, time.monotonic()
        while sent < limit_bytes and time.monotonic() - start < limit_s:
            proto.send_frame(conn, frame, payload)
            sent += len(payload) + 16
            if pause:
                time.sleep(pause)
    return reply


def test_endless_frames_for_a_call(liar) -> None:
    client = GuestClient(liar(_endless({"noise": 1})))
    exc = _within(10, client.ps)
    assert isinstance(exc, GuestProtocolError), exc


def test_endless_output_does_not_grow_the_host(liar) -> None:
    client = GuestClient(liar(_endless({"stream": "stdout"}, b"x" * proto.CHUNK)))
    before = _rss_mb()
    exc = _within(20, lambda: client.output(1, max_output=1 << 20))
    assert isinstance(exc, GuestProtocolError), exc
    assert _rss_mb() - before < 100, "the host grew with the guest's output"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before < 200


def test_trickle_cannot_outlive_the_call_deadline(liar, monkeypatch) -> None:
    monkeypatch.setattr(guest_client, "STREAM_GRACE", 1.0)

    def started_then_trickle(conn: socket.socket, req: dict) -> None:
        proto.send_frame(conn, {"pid": 7})
        _endless({"stream": "stdout"}, b".", pause=0.2)(conn, req)

    client = GuestClient(liar(started_then_trickle))
    began = time.monotonic()
    exc = _within(15, lambda: client.exec(["true"], timeout=1))
    assert isinstance(exc, SandboxTimeoutError), exc
    assert time.monotonic() - began < 5


@pytest.mark.parametrize(("op", "reply"), [
    ("ps", {"done": True, "processes": "not a list"}),
    ("kill", {"done": True, "killed": "yes"}),
    ("exists", {"done": True, "exists": 1}),
    ("start", {"done": True, "pid": "1; rm -rf /"}),
    ("exec", {"pid": 1.5}),
    ("output", {"done": True, "running": "no"}),
    ("list", {"done": True, "entries": {"a": 1}}),
    ("error", {"error": ["not", "a", "dict"]}),
])
def test_wrong_types_are_refused(liar, op: str, reply: dict) -> None:
    client = GuestClient(liar(lambda conn, req: proto.send_frame(conn, reply)))
    calls = {"ps": client.ps, "kill": lambda: client.kill(1), "exists": lambda: client.exists("/x"),
             "start": lambda: client.start(["true"]), "exec": lambda: client.exec(["true"]),
             "output": lambda: client.output(1), "list": lambda: client.list("/"),
             "error": client.ping}
    exc = _within(10, calls[op])
    assert isinstance(exc, GuestProtocolError), exc


def test_oversized_and_nested_frames(liar) -> None:
    def huge(conn: socket.socket, req: dict) -> None:
        conn.sendall(struct.pack("!II", (64 << 20), 0))  # claims 64 MiB of JSON
    def deep(conn: socket.socket, req: dict) -> None:
        body = b"[" * 100000 + b"]" * 100000
        conn.sendall(struct.pack("!II", len(body), 0) + body)
    for reply in (huge, deep):
        exc = _within(10, GuestClient(liar(reply)).ping)
        assert isinstance(exc, GuestProtocolError), exc


def test_endless_error_text_is_cut(liar) -> None:
    reply = {"error": {"code": "not_found", "message": "x" * (4 << 20)}}
    exc = _within(10, GuestClient(liar(lambda c, r: proto.send_frame(c, reply))).ping)
    assert exc is not None and len(str(exc)) <= guest_client.MAX_ERROR_TEXT + 100


def _half_a_frame(sent: threading.Event | None = None) -> Reply:
    """Started, then an output frame cut short: the guest closes (or, given ``sent``, says
    so and waits)."""
    def reply(conn: socket.socket, req: dict) -> None:
        proto.send_frame(conn, {"started": True, "pid": 7})
        head, _ = proto.encode_frame({"stream": "stdout"}, b"x" * proto.CHUNK)
        conn.sendall(head + b"x" * (proto.CHUNK // 2))
        if sent is not None:
            sent.set()
            time.sleep(20)
    return reply


def test_a_frame_cut_short_is_a_broken_connection_not_a_lie(liar) -> None:
    """The sandbox is stopped for a lying guest (``GuestProtocolError``): a connection
    that ends part way through a frame is only broken."""
    exc = _within(10, lambda: GuestClient(liar(_half_a_frame())).exec(["yes"]))
    assert isinstance(exc, GuestUnavailableError) and not isinstance(exc, GuestProtocolError)


def test_cancelling_a_call_mid_frame_is_a_cancel(liar) -> None:
    """A call cancelled while a large output frame was on its way (a client that stopped
    following an endless output) cut that frame short itself: that was taken for a lying
    guest, and the gateway stopped the sandbox with every process in it."""
    sent = threading.Event()
    client = GuestClient(liar(_half_a_frame(sent)))
    call = CallCancel()

    def cancel_mid_frame() -> None:
        sent.wait(10)
        call.cancel()

    threading.Thread(target=cancel_mid_frame, daemon=True).start()
    exc = _within(10, lambda: call.run(client.exec, ["yes"], detach=True))
    assert isinstance(exc, CancelledCallError), exc


def test_a_guest_cannot_answer_for_the_gateway(liar) -> None:
    """A guest's error code is one of its own failures: 'unauthenticated' from it would be
    a 401 to the gateway's caller (the console signs out, the call goes unaudited)."""
    for code in ("unauthenticated", "permission_denied", "made_up"):
        reply = {"error": {"code": code, "message": "no"}}
        exc = _within(10, GuestClient(liar(lambda c, r, x=reply: proto.send_frame(c, x))).ping)
        assert type(exc) is SandboxError and exc.code == "internal", (code, exc)
    reply = {"error": {"code": "not_found", "message": "gone"}}
    exc = _within(10, GuestClient(liar(lambda c, r: proto.send_frame(c, reply))).ping)
    assert isinstance(exc, NotFoundError)
