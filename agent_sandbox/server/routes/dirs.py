"""/v1/sandboxes/{id}/files/archive: a directory as a tar stream, out and in.

``GET`` streams the directory as the guest packs it (the SDK's ``download_dir`` extracts
it, confined, on the caller's side); ``PUT`` takes a tar stream and the guest extracts it
into the directory, confined to it. Neither end holds an archive whole."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from agent_sandbox.models import DirTransfer
from agent_sandbox.server.routes._deps import Caller, SandboxId, State
from agent_sandbox.server.routes.files import FilePath
from agent_sandbox.server.streaming import request_chunks

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/files", tags=["files"])
TAR = "application/x-tar"


@router.get("/archive", response_class=StreamingResponse,
            responses={200: {"content": {TAR: {}}}})
def download_dir(sandbox_id: SandboxId, state: State, path: FilePath) -> StreamingResponse:
    # The first chunk is read before the status goes out: a missing directory is a 404.
    chunks = state.provider.read_dir_archive(sandbox_id, path)
    return StreamingResponse(chunks, media_type=TAR)


@router.put("/archive", openapi_extra={"requestBody": {
    "content": {TAR: {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_dir(sandbox_id: SandboxId, state: State, request: Request,
                     path: FilePath, who: Caller) -> DirTransfer:
    chunks = request_chunks(request.stream())

    def write() -> DirTransfer:
        with state.quotas.upload_slot(who.key):  # it holds a thread while the client sends
            return state.provider.write_dir_archive(sandbox_id, path, chunks)

    return await anyio.to_thread.run_sync(write)
