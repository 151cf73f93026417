"""Raw Streamable HTTP MCP on the wire: the headers, the initialize body, reply parsing."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}}


def rpc_text(body: str, content_type: str) -> dict[str, Any]:
    """The JSON-RPC message of a reply that is either plain JSON or one SSE event."""
    if content_type.startswith("text/event-stream"):
        for line in body.splitlines():
            if line.startswith("data:") and line[5:].strip():
                return json.loads(line[5:])
    return json.loads(body)


def rpc_body(resp: httpx.Response) -> dict[str, Any]:
    return rpc_text(resp.text, resp.headers.get("content-type", ""))
