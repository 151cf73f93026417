"""Servers to start inside a sandbox for the ports tests: HTTP (the stdlib's), a raw TCP
echo, and a WebSocket echo (the host's `websockets` package, copied in)."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

ECHO = """
import socket, threading
srv = socket.create_server(("127.0.0.1", 9001))
def serve(c):
    with c:
        while data := c.recv(65536):
            c.sendall(data)
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
"""

WS_ECHO = """
import asyncio, sys
sys.path.insert(0, "/tmp/wslib")
from websockets.asyncio.server import serve
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with serve(echo, "127.0.0.1", 9002, compression=None):
        await asyncio.Future()
asyncio.run(main())
"""


def start(sb: Any) -> None:
    """HTTP on 8000 (serving /workspace), TCP echo on 9001, WebSocket echo on 9002."""
    sb.files.write("/workspace/hello.txt", "hello from inside\n")
    package = Path(websockets.__file__).parent
    for path in package.rglob("*.py"):
        sb.files.write(f"/tmp/wslib/websockets/{path.relative_to(package)}", path.read_bytes())
    sb.files.write("/tmp/echo.py", ECHO)
    sb.files.write("/tmp/ws_echo.py", WS_ECHO)
    sb.commands.run("cd /workspace && python3 -m http.server 8000 --bind 127.0.0.1",
                    background=True)
    sb.commands.run("python3 /tmp/echo.py", background=True)
    sb.commands.run("python3 /tmp/ws_echo.py", background=True)
    probe = ("for p in 8000 9001 9002; do python3 -c \"import socket; "
             "socket.create_connection(('127.0.0.1', $p), 1)\" || exit 1; done")
    deadline = time.monotonic() + 30
    while sb.commands.run(probe).exit_code != 0:
        assert time.monotonic() < deadline, "the servers inside did not start"
        time.sleep(0.1)


def echoes(address: tuple[str, int], size: int) -> bool:
    """Send ``size`` bytes to the echo server at ``address``, end sending, and check that
    exactly they come back (half-close carried through)."""
    payload = bytes(range(256)) * (size // 256)
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got == payload


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError as exc:  # nothing answered (yet): status 0 and why
        return 0, str(exc).encode()
