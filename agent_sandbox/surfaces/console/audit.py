"""A sandbox's audit trail: the REST calls made on it, written beside the MCP server's
tool calls in the engine's audit log, and read back for the console.

A REST record has the method, the route's path without its query (no file names, no
contents), the status and the sandbox: sizes and shapes only, as the MCP records."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_sandbox.core.audit import AuditLog
from agent_sandbox.surfaces.http.auth import AUDIT_SCOPE_KEY

# /v1/sandboxes/{id}[/...]: the sandbox a call is about.
_SANDBOX_PATH = re.compile(r"^/v1/sandboxes/(sbx-[a-z0-9]{1,40})(/[^?]*)?$")
# Reads of what a page polls (the sandbox, its processes, its metrics) are not recorded:
# a console open on a sandbox would fill the trail with them.
_POLLED = frozenset({"/", "/processes", "/metrics"})
TAIL_BYTES = 2 << 20  # the newest part of the log read for a trail
MOST = 500  # records shown, newest ones


def audit_log(provider: object) -> AuditLog | None:
    log = getattr(provider, "audit", None)
    return log if isinstance(log, AuditLog) and log.enabled else None


class RestAudit:
    def __init__(self, app: ASGIApp, provider: object) -> None:
        self.app, self.provider = app, provider

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = _SANDBOX_PATH.match(scope.get("path", "")) if scope["type"] in (
            "http", "websocket") else None
        log = audit_log(self.provider) if found else None
        if log is None or found is None or (
                scope.get("method") in ("GET", "HEAD") and (found.group(2) or "/") in _POLLED):
            await self.app(scope, receive, send)
            return
        status = {"code": 0}
        # Marked by the tenancy check (http.auth.check_sandbox): a call by no caller (401)
        # or by one that may not use the sandbox (404) is not its history, and recorded
        # would let anyone fill its trail and push the owner's records out of it.
        mark: dict[str, bool] = {}
        scope[AUDIT_SCOPE_KEY] = mark  # in place: outer layers read what routing adds

        async def watched(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                status["code"] = message["status"]
            elif message["type"] == "websocket.accept":
                status["code"] = 101
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            if mark.get("allowed"):
                self._record(log, scope, found, status["code"])

    @staticmethod
    def _record(log: AuditLog, scope: Scope, found: re.Match[str], status: int) -> None:
        who = scope.get("abx.principal")
        log.record(event="rest.call", transport="rest", method=scope.get("method", "WEBSOCKET"),
                   route=(found.group(2) or "/")[:200], sandbox_id=found.group(1),
                   status=status, via="console" if "abx.console" in scope else None,
                   owner=getattr(who, "owner", None))


def sandbox_trail(provider: object, sandbox_id: str,
                  mcp_log: Path | None) -> list[dict[str, Any]]:
    """The newest records about one sandbox, oldest first: the engine's log (REST calls,
    ends the service decided) and the MCP servers' log (tool calls), each read from its
    last TAIL_BYTES."""
    engine = audit_log(provider)
    paths = list(dict.fromkeys(p for p in (engine.path if engine else None, mcp_log)
                               if p is not None))
    trail = [entry for path in paths for entry in _tail(path, sandbox_id)]
    trail.sort(key=lambda entry: entry.get("time") or 0)
    return trail[-MOST:]


def _tail(path: Path, sandbox_id: str) -> list[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return []
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read(TAIL_BYTES)
    needle = f'"sandbox_id":"{sandbox_id}"'.encode()
    found = []
    for line in tail.splitlines():
        if needle not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("sandbox_id") == sandbox_id:
            found.append(entry)
    return found
