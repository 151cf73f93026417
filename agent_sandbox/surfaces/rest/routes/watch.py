"""/v1/sandboxes/{id}/files/watch: a directory's changes as Server-Sent Events (see
``agent_sandbox.surfaces.http.watch_relay`` for the stream)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from agent_sandbox.core.watch import MAX_WATCH_TIMEOUT
from agent_sandbox.surfaces.http.watch_relay import Relay
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State
from agent_sandbox.surfaces.rest.routes.files import FilePath
from agent_sandbox.surfaces.rest.schemas import positive

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/files", tags=["files"])
_SSE_DOC = {200: {"description": "`event: ready`, then one event per change "
                                 "(a FilesystemEvent as JSON), then `event: end` or "
                                 "`event: error`", "content": {"text/event-stream": {}}}}
Recursive = Annotated[bool, Query(description="watch subdirectories too")]
WatchTimeout = Annotated[float | None, Query(
    description="seconds after which the watch ends (default: when the client goes)",
    json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_WATCH_TIMEOUT}),
    positive("timeout", MAX_WATCH_TIMEOUT, allow_none=True)]


@router.get("/watch", response_class=StreamingResponse, responses=_SSE_DOC)
async def watch(sandbox_id: SandboxId, state: State, who: Caller, path: FilePath,
                recursive: Recursive = False,
                timeout: WatchTimeout = None) -> StreamingResponse:
    """Changes in a directory as they happen: create, modify, chmod, delete, rename (with
    `old_path`), and overflow when events were lost."""
    release = state.watches.take(who.owner)
    try:
        stream = await anyio.to_thread.run_sync(lambda: state.provider.watch_dir(
            sandbox_id, path, recursive=recursive, timeout=timeout))
    except BaseException:
        release()
        raise
    relay = Relay(stream, asyncio.get_running_loop(), release)
    return StreamingResponse(relay.sse(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
