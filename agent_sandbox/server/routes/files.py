"""/v1/sandboxes/{id}/files: streamed upload and download, listing, metadata, changes."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from agent_sandbox.models import EntryInfo
from agent_sandbox.server.routes._deps import SandboxId, State
from agent_sandbox.server.schemas import Exists, PathBody, RenameBody, Written
from agent_sandbox.server.streaming import request_chunks

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/files", tags=["files"])
_BYTES_DOC = {200: {"content": {"application/octet-stream": {}}}}


@router.get("/content", response_class=StreamingResponse, responses=_BYTES_DOC)
def download(sandbox_id: SandboxId, state: State, path: str, offset: int = 0,
             limit: int | None = None) -> StreamingResponse:
    # The engine reads the first chunk eagerly: a missing file is a 404 status, not a
    # broken stream. The rest is pulled chunk by chunk as the client reads.
    chunks = state.engine.read_file(sandbox_id, path, offset=offset, limit=limit)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.put("/content", openapi_extra={"requestBody": {
    "content": {"application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}}})
async def upload(sandbox_id: SandboxId, state: State, request: Request, path: str,
                 mode: int = 0o644) -> Written:
    chunks = request_chunks(request.stream())
    size = await anyio.to_thread.run_sync(
        lambda: state.engine.write_file(sandbox_id, path, chunks, mode=mode))
    return Written(size=size)


@router.get("")
def list_files(sandbox_id: SandboxId, state: State, path: str,
               depth: int = 1) -> list[EntryInfo]:
    return state.engine.list_files(sandbox_id, path, depth=depth)


@router.get("/stat")
def stat(sandbox_id: SandboxId, state: State, path: str) -> EntryInfo:
    return state.engine.stat(sandbox_id, path)


@router.get("/exists")
def exists(sandbox_id: SandboxId, state: State, path: str) -> Exists:
    return Exists(exists=state.engine.exists(sandbox_id, path))


@router.post("/mkdir", status_code=204)
def make_dir(sandbox_id: SandboxId, state: State, body: PathBody) -> Response:
    state.engine.make_dir(sandbox_id, body.path)
    return Response(status_code=204)


@router.delete("", status_code=204)
def remove(sandbox_id: SandboxId, state: State, path: str) -> Response:
    state.engine.remove(sandbox_id, path)
    return Response(status_code=204)


@router.post("/rename", status_code=204)
def rename(sandbox_id: SandboxId, state: State, body: RenameBody) -> Response:
    state.engine.rename(sandbox_id, body.src, body.dst)
    return Response(status_code=204)
