"""Forwarded ports under attack from inside (root here; rootless via rootless_battery.py):
a server that accepts and then stalls, one that floods, and more connections than a
sandbox may have cost only that sandbox's own connections, never the engine."""

from __future__ import annotations

import socket
import time

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.guestlink.ports import MAX_CONNECTIONS

pytestmark = pytest.mark.integration

_STALL = r'''
import socket
srv = socket.create_server(("127.0.0.1", 9101), backlog=1024)
held = []
while True:  # accepts, never reads or writes
    held.append(srv.accept()[0])
'''
_FLOOD = r'''
import socket, threading
srv = socket.create_server(("127.0.0.1", 9102))
def pour(c):
    try:
        while True:
            c.sendall(b"x" * 65536)
    except OSError:
        pass
while True:  # writes without end to whoever connects
    threading.Thread(target=pour, args=(srv.accept()[0],), daemon=True).start()
'''


def _listening(sb: Sandbox, port: int) -> None:
    sb.commands.run(f"for i in $(seq 100); do python3 -c \"import socket; socket."
                    f"create_connection(('127.0.0.1', {port}))\" 2>/dev/null && break; "
                    "sleep 0.1; done")


def test_stalling_and_flooding_servers_cost_only_their_connections(sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/stall.py", _STALL)
    sandbox.files.write("/tmp/flood.py", _FLOOD)
    stall = sandbox.commands.run("python3 /tmp/stall.py", background=True)
    sandbox.commands.run("python3 /tmp/flood.py", background=True)
    _listening(sandbox, 9101)
    _listening(sandbox, 9102)
    host, port = sandbox.get_host(9101).split(":")
    held = [socket.create_connection((host, int(port)), timeout=5)
            for _ in range(MAX_CONNECTIONS + 40)]
    for s in held:
        s.sendall(b"hello?")
    started = time.monotonic()
    closed = 0
    for s in held[-40:]:  # past the cap: closed at once
        s.settimeout(5)
        try:
            closed += s.recv(10) == b""
        except ConnectionResetError:
            closed += 1
    assert closed == 40 and time.monotonic() - started < 5
    assert sandbox.commands.run("echo alive").stdout == "alive\n"  # the engine answers
    stall.kill()  # the server inside goes: its connections end, the slots come back
    for s in held:
        s.close()
    host, port = sandbox.get_host(9102).split(":")
    deadline = time.monotonic() + 20
    while True:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            try:
                got = s.recv(65536)
            except ConnectionResetError:
                got = b""
            if got:
                time.sleep(1)  # we stop reading: the relay waits on us, nothing grows
                break
        assert time.monotonic() < deadline, "the sandbox's slots did not come back"
        time.sleep(0.2)
    assert sandbox.commands.run("echo alive").stdout == "alive\n"
