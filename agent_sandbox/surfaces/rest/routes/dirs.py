"""/v1/sandboxes/{id}/files/archive: a directory as a tar stream, out and in.

``GET`` streams the directory as the guest packs it (the SDK's ``download_dir`` extracts
it, confined, on the caller's side); ``PUT`` takes a tar stream and the guest extracts it
into the directory, confined to it, as ``user`` would own it. Neither end holds an archive
whole."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator

from agent_sandbox.core import validate
from agent_sandbox.core.models import DirTransfer
from agent_sandbox.surfaces.http.streaming import request_chunks
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State
from agent_sandbox.surfaces.rest.routes.files import FilePath

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/files", tags=["files"])
TAR = "application/x-tar"
Owner = Annotated[str | None, Query(description="the account what the archive makes (files, "
                                    "directories, links, the directories made for `path`) "
                                    "belongs to (default root); a replaced file keeps its "
                                    "owner", json_schema_extra={
                                        "pattern": validate.USER_NAME_PATTERN}),
                  AfterValidator(validate.user)]


@router.get("/archive", response_class=StreamingResponse,
            responses={200: {"content": {TAR: {}}}})
def download_dir(sandbox_id: SandboxId, state: State, path: FilePath) -> StreamingResponse:
    # The first chunk is read before the status goes out: a missing directory is a 404.
    chunks = state.provider.read_dir_archive(sandbox_id, path)
    return StreamingResponse(chunks, media_type=TAR)


@router.put("/archive", openapi_extra={"requestBody": {
    "content": {TAR: {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_dir(sandbox_id: SandboxId, state: State, request: Request,
                     path: FilePath, who: Caller, user: Owner = None) -> DirTransfer:
    chunks = request_chunks(request.stream())

    def write() -> DirTransfer:
        with state.quotas.upload_slot(who.key):  # it holds a thread while the client sends
            return state.provider.write_dir_archive(sandbox_id, path, chunks, user=user)

    return await anyio.to_thread.run_sync(write)
