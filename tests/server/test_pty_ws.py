"""Terminals on the gateway's WebSocket: authenticated and owned as REST is, the wire
protocol as documented (docs/terminals.md), clients that misbehave or vanish, and a
client that stops reading not growing the gateway."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from _gw import Gateway
from ptyscreen import Screen

from agent_sandbox.core.errors import NotFoundError, ResourceExhaustedError, UnauthenticatedError
from agent_sandbox.remote import RemoteProvider
from agent_sandbox.surfaces.http.quotas import TERMINALS_PER_KEY

pytestmark = pytest.mark.integration
websockets_client = pytest.importorskip("websockets.sync.client",
                                        reason="needs the websockets package")


def _ws(gw: Gateway, sandbox_id: str, who: str | None) -> object:
    headers = {"Authorization": f"Bearer {gw.tokens[who]}"} if who else {}
    url = gw.url.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox_id}/pty"
    return websockets_client.connect(url, additional_headers=headers, compression=None,
                                     open_timeout=30)


def test_keys_and_owners_as_for_rest(gw: Gateway, sandbox_a: str) -> None:
    with pytest.raises(UnauthenticatedError, match="API key is required"):
        RemoteProvider(gw.url, None).pty_open(sandbox_a)
    with pytest.raises(UnauthenticatedError, match="unknown or revoked"):
        RemoteProvider(gw.url, "not-a-key").pty_open(sandbox_a)
    with pytest.raises(NotFoundError, match="not found"):
        gw.provider("b").pty_open(sandbox_a)
    with pytest.raises(NotFoundError, match="not found"):
        gw.provider("a").pty_open("sbx-0000000000")
    term = gw.provider("a").pty_open(sandbox_a, cmd="sleep 600")
    try:
        with pytest.raises(NotFoundError, match="not found"):
            gw.provider("b").pty_kill(sandbox_a, term.pid)  # B cannot reach it by pid
        with pytest.raises(NotFoundError, match="not found"):
            gw.provider("b").pty_open(sandbox_a, term.pid)
        assert gw.provider("admin").pty_kill(sandbox_a, term.pid)
        assert term.wait(15) == 137
    finally:
        term.close()


def test_the_wire_protocol(gw: Gateway, sandbox_a: str) -> None:
    with _ws(gw, sandbox_a, "a") as ws:
        ws.send(json.dumps({"cols": 70, "rows": 20, "cmd": "stty size; read x; echo got-$x; "
                                                         "sleep 600"}))
        assert json.loads(ws.recv(30))["pid"] > 1
        assert ws.recv(30) == b"20 70\r\n"
        ws.send(b"abc\r")
        text = b""
        while b"got-abc" not in text:
            text += ws.recv(30)
        ws.send(json.dumps({"kill": 9}))
        assert json.loads(ws.recv(30)) == {"exit_code": 137}
    with _ws(gw, sandbox_a, "a") as ws:
        ws.send("not json")
        event = json.loads(ws.recv(30))
        assert event["error"]["code"] == "invalid_argument"
        assert "first message" in event["error"]["message"]
    with _ws(gw, sandbox_a, "a") as ws:
        ws.send(json.dumps({"cols": "wide"}))
        assert json.loads(ws.recv(30))["error"]["code"] == "invalid_argument"


def test_a_vanished_client_only_detaches(gw: Gateway, sandbox_a: str) -> None:
    provider = gw.provider("a")
    screen = Screen()
    term = provider.pty_open(sandbox_a, on_data=screen)
    term.send_input("echo one-$((1+1))\n")
    screen.expect("one-2")
    # The client's socket dies without a WebSocket close.
    term._ws.socket.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="lost the terminal connection|keeps running"):
        term.wait(15)
    again = Screen()
    other = provider.pty_open(sandbox_a, term.pid, on_data=again)
    again.expect("one-2")
    other.send_input("exit 8\n")
    assert other.wait(15) == 8


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_stops_reading_does_not_grow_the_gateway(gw: Gateway,
                                                               sandbox_a: str) -> None:
    assert gw.proc.proc is not None
    before = _rss_kib(gw.proc.proc.pid)
    with _ws(gw, sandbox_a, "a") as ws:
        ws.send(json.dumps({"cmd": "head -c 400000000 /dev/zero; echo; echo DONE"}))
        pid = json.loads(ws.recv(30))["pid"]
        time.sleep(8)  # reading nothing while 400 MB are printed
        grown = _rss_kib(gw.proc.proc.pid) - before
        # Another client still gets the end, and an exit code: nothing is stuck.
        screen = Screen()
        other = gw.provider("a").pty_open(sandbox_a, pid, on_data=screen)
        assert other.wait(120) == 0
        screen.expect("DONE")
    assert grown < 100 << 10, f"the gateway grew by {grown >> 10} MiB"


def test_attachments_per_key_are_capped(gw: Gateway, sandbox_a: str) -> None:
    """Each open terminal WebSocket holds gateway resources: one key gets a bounded number
    (a 429 past it); another key is not affected."""
    held = [_ws(gw, sandbox_a, "a").__enter__() for _ in range(TERMINALS_PER_KEY)]
    try:
        with pytest.raises(ResourceExhaustedError, match="terminals attached"):
            gw.provider("a").pty_open(sandbox_a)
        term = gw.provider("admin").pty_open(sandbox_a, cmd="exit 2")
        assert term.wait(15) == 2
    finally:
        for ws in held:
            ws.close()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while True:  # the gateway notices the closes
        try:
            term = gw.provider("a").pty_open(sandbox_a, cmd="exit 3")
            break
        except ResourceExhaustedError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert term.wait(15) == 3


def test_attaching_to_an_ended_terminal(gw: Gateway, sandbox_a: str) -> None:
    """It ends as soon as it is opened: the gateway must still answer, and keep serving."""
    provider = gw.provider("a")
    first = provider.pty_open(sandbox_a, cmd="echo bye-$((2+3)); exit 5")
    assert first.wait(15) == 5
    for _ in range(5):
        screen = Screen()
        assert provider.pty_open(sandbox_a, first.pid, on_data=screen).wait(15) == 5
        screen.expect("bye-5")
    for code in range(10):  # no output at all: ended before the gateway has answered
        assert provider.pty_open(sandbox_a, cmd=f"exit {code}").wait(15) == code
    assert provider.run(sandbox_a, "echo still-serving").stdout == "still-serving\n"
