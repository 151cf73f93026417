"""A lean MCP load client for bench/mcp.py's burst: raw JSON-RPC over HTTP/1.1 keep-alive.

    python bench/_mcp_lean.py URL SERVER_PID [--sessions 4] [--concurrency 200] [--repeat 3]

The official `mcp` client spends more CPU per call than the server (a task group, memory
streams and pydantic models per request), so a burst driven by it measures the client. This
one opens a session per ``--sessions`` the normal way (initialize, then
notifications/initialized, then a warm-up run_command that makes the default sandbox), opens
``--concurrency`` keep-alive connections, then fires one ``tools/call run_command true`` per
connection at once: per call a prebuilt request and a Content-Length read, nothing else.
It runs as a process of its own (bench/mcp.py spawns it) so its CPU does not share a GIL with
anything, and prints one JSON line: per burst the latencies, errors, wall, the server's CPU
per call (/proc/SERVER_PID/stat before and after) and its own CPU per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from _mcp_http import cpu_split_ms  # noqa: E402

PROTOCOL = "2025-06-18"


class Conn:
    """One keep-alive HTTP/1.1 connection: a request at a time, JSON bodies only."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port, self.path = host, port, path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def request(self, body: bytes, session: str | None = None) -> bytes:
        head = (f"POST {self.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
                "content-type: application/json\r\n"
                "accept: application/json, text/event-stream\r\n"
                f"mcp-protocol-version: {PROTOCOL}\r\ncontent-length: {len(body)}\r\n")
        if session:
            head += f"mcp-session-id: {session}\r\n"
        return head.encode() + b"\r\n" + body

    async def send(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                body += (await self.reader.readexactly(size + 2))[:size]
                if size == 0:
                    break
        else:
            body = b""
        return status, headers, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _call(msg_id: int, command: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
                       "params": {"name": "run_command",
                                  "arguments": {"command": command}}}).encode()


def _error(status: int, body: bytes) -> str | None:
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    if body.startswith(b"event:") or b"\ndata:" in body:  # an SSE answer: take its data
        body = body.split(b"data:", 1)[1].split(b"\n", 1)[0]
    reply = json.loads(body)
    if "error" in reply:
        return f"JSON-RPC error: {reply['error']}"
    result = reply["result"]
    if result.get("isError"):
        return " ".join(c.get("text", "") for c in result["content"])[:300]
    return None


async def _session(host: str, port: int, path: str) -> str:
    conn = Conn(host, port, path)
    await conn.open()
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": "bench-lean", "version": "0"}}}
    status, headers, body = await conn.send(conn.request(json.dumps(init).encode()))
    if status != 200 or "mcp-session-id" not in headers:
        raise RuntimeError(f"initialize: HTTP {status} {body[:200]!r}")
    sid = headers["mcp-session-id"]
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
    status, _, body = await conn.send(conn.request(note, sid))
    if status != 202:
        raise RuntimeError(f"notifications/initialized: HTTP {status} {body[:200]!r}")
    status, _, body = await conn.send(conn.request(_call(1, "true"), sid))  # default sandbox
    problem = _error(status, body)
    if problem:
        raise RuntimeError(f"warm-up run_command: {problem}")
    conn.close()
    return sid


async def _one(conn: Conn, raw: bytes, samples: list[float], errors: list[str]) -> None:
    start = time.perf_counter()
    try:
        status, _, body = await conn.send(raw)
        problem = _error(status, body)
    except Exception as exc:  # noqa: BLE001 - counted, not fatal
        problem = f"{type(exc).__name__}: {exc}"
    samples.append((time.perf_counter() - start) * 1000)
    if problem:
        errors.append(problem)


async def main(opts: argparse.Namespace) -> dict[str, Any]:
    url = urlsplit(opts.url)
    host, port, path = url.hostname or "127.0.0.1", url.port or 80, url.path
    sids = [await _session(host, port, path) for _ in range(opts.sessions)]
    conns = [Conn(host, port, path) for _ in range(opts.concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    runs = []
    next_id = 100
    for _ in range(opts.repeat):
        raws = []
        for i, conn in enumerate(conns):
            raws.append(conn.request(_call(next_id, "true"), sids[i % len(sids)]))
            next_id += 1
        samples: list[float] = []
        errors: list[str] = []
        (user, system), mine = cpu_split_ms(opts.pid), time.process_time()
        began = time.perf_counter()
        await asyncio.gather(*(_one(c, r, samples, errors)
                               for c, r in zip(conns, raws, strict=True)))
        wall = (time.perf_counter() - began) * 1000
        user_after, system_after = cpu_split_ms(opts.pid)
        n = opts.concurrency
        runs.append({"samples": samples, "errors": len(errors),
                     "first": errors[0] if errors else None, "wall": wall,
                     "cpu": (user_after + system_after - user - system) / n,
                     "sys_cpu": (system_after - system) / n,
                     "client_cpu": (time.process_time() - mine) * 1000 / n})
        await asyncio.sleep(0.5)  # let the server settle between bursts
    for conn in conns:
        conn.close()
    for sid in sids:  # end the sessions (and their sandboxes)
        conn = Conn(host, port, path)
        await conn.open()
        assert conn.writer is not None
        conn.writer.write(f"DELETE {path} HTTP/1.1\r\nhost: {host}:{port}\r\n"
                          f"mcp-session-id: {sid}\r\ncontent-length: 0\r\n\r\n".encode())
        await conn.send(b"")
        conn.close()
    return {"runs": runs}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("pid", type=int)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
