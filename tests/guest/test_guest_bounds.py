"""Every integer the guest takes from the wire, at its boundaries: each request gets an
answer (a result, or an error naming the field), never a dropped connection or an
internal error, and the guest keeps serving. A real guest process, through GuestClient."""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _agent import running_guest

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.guest import protocol as proto
from agent_sandbox.guestlink.client import (
    GuestClient,
    GuestProtocolError,
    GuestUnavailableError,
)

INTS = [0, 1, 2**31, 2**62 - 1, 2**62, 2**63 - 1, 2**64, -1, -(2**63)]
ODD = [True, 1.5, "7", [], math.nan, math.inf, -math.inf, 1e308]


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GuestClient, Path]]:
    folder = tmp_path_factory.mktemp("bounds")
    (folder / "f").write_bytes(b"hello")
    with running_guest(folder) as client:
        client.io_timeout = 10.0  # a request the guest loses track of fails the test fast
        yield client, folder


def _answered(call: Any) -> Any:
    """``call()``'s result, or the error it answered with: never a dropped connection, a
    malformed reply or an internal error."""
    try:
        return call()
    except (GuestUnavailableError, GuestProtocolError) as exc:
        pytest.fail(f"no answer: {exc!r}")
    except SandboxError as exc:
        assert exc.code != "internal", exc.message
        return exc


def _call(client: GuestClient, req: dict[str, Any]) -> Any:
    def run() -> dict[str, Any]:
        conn = client._open(req)
        try:
            return conn.final()
        finally:
            conn.close()

    return _answered(run)


@pytest.mark.parametrize("value", INTS + ODD, ids=repr)
def test_read_offset_and_limit(guest: tuple[GuestClient, Path], value: Any) -> None:
    """Any offset or limit in range reads (nothing past the end, even past the largest
    file the filesystem holds); any other is refused, naming the field."""
    client, folder = guest
    in_range = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**62
    for field, other in (("offset", {"limit": 1}), ("limit", {"offset": 0})):
        req = {"op": "read", "path": str(folder / "f"), field: value, **other}
        got = _answered(lambda req=req: b"".join(client._read_stream(req)))
        if in_range:
            assert isinstance(got, bytes), (field, got)
            expect = b"hello"[value:value + 1] if field == "offset" else b"hello"[:value]
            assert got == expect, (field, value)
        else:
            assert isinstance(got, SandboxError) and field in got.message, (field, got)


@pytest.mark.parametrize("value", INTS + ODD, ids=repr)
def test_every_integer_field(guest: tuple[GuestClient, Path], value: Any,
                             tmp_path: Path) -> None:
    client, folder = guest
    done = client.start(["true"], cwd="/")  # a pid that is there (and finished)
    tmp = str(tmp_path)
    small = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 2
    requests = [
        {"op": "list", "path": tmp, "depth": value},
        {"op": "mkdir", "path": f"{tmp}/m", "mode": value},
        {"op": "exec", "argv": ["true"], "cwd": "/", "max_output": value},
        {"op": "exec", "argv": ["true"], "cwd": "/", "background": True, "max_output": value},
        {"op": "exec", "argv": ["true"], "cwd": "/", "timeout": value},
        {"op": "output", "pid": value},
        {"op": "wait", "pid": value},
        {"op": "wait", "pid": done, "timeout": value},
        {"op": "kill", "pid": value},
        {"op": "kill", "pid": done, "signal": value},
        {"op": "pty_create", "argv": ["true"], "cols": value},
        {"op": "pty_create", "argv": ["true"], "rows": value},
        {"op": "pty_attach", "pid": value},
        {"op": "pty_kill", "pid": value},
        {"op": "port_connect", "port": value},
    ]
    if not small:  # a watch in range lasts its timeout
        requests.append({"op": "watch", "path": tmp, "timeout": value})
    for req in requests:
        if req["op"] == "pty_create" and isinstance(value, int) and 0 < value < 10000:
            continue  # a terminal of that size: runs
        _call(client, req)
    got = _answered(lambda: client._send_stream(
        {"op": "write", "path": f"{tmp}/w", "mode": value}, b"x"))
    assert isinstance(got, (dict, SandboxError))
    assert client.ping()["version"] == proto.VERSION


def test_a_handlers_os_error_is_answered() -> None:
    """An OSError a handler lets out is the handler's (not the connection's): the client
    gets it as an error reply, and the connection is not just dropped."""
    from agent_sandbox.guest.server import Agent

    agent = Agent(None)

    def boom(conn: Any, req: Any) -> None:
        raise OSError(5, "Input/output error")

    agent.ops["boom"] = boom
    ours, theirs = socket.socketpair()
    worker = threading.Thread(target=agent.handle, args=(theirs,))
    worker.start()
    with ours, ours.makefile("rb") as rfile:
        proto.send_frame(ours, {"op": "boom"})
        frame = proto.read_frame(rfile)
        ours.shutdown(socket.SHUT_WR)
    worker.join(5)
    assert frame is not None
    assert frame[0]["error"] == {"code": "internal",
                                 "message": "op 'boom': Input/output error"}
