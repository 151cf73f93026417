"""/v1/sandboxes/{id}/files: streamed upload and download, listing, metadata, changes."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator

from agent_sandbox.models import EntryInfo
from agent_sandbox.runtime import validate
from agent_sandbox.server.routes._deps import Caller, SandboxId, State
from agent_sandbox.server.schemas import (
    MAX_DEPTH,
    MAX_FILE_OFFSET,
    MAX_MODE,
    WRITE_SPARE,
    Exists,
    MakeDir,
    RenameBody,
    Written,
    absolute,
    path_schema,
    positive,
)
from agent_sandbox.server.streaming import request_chunks

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/files", tags=["files"])
_BYTES_DOC = {200: {"content": {"application/octet-stream": {}}}}
FilePath = Annotated[str, Query(description="absolute path in the sandbox",
                                json_schema_extra=path_schema()), absolute("path")]
# Read or removed: its last name is not empty, `.` or `..`; written: a shorter one too.
File = Annotated[str, Query(description="absolute path of a file in the sandbox",
                            json_schema_extra=path_schema(file=True)),
                 absolute("path", file=True)]
NewFile = Annotated[str, Query(description="absolute path of the file to write",
                               json_schema_extra=path_schema(file=True, spare=WRITE_SPARE)),
                    absolute("path", file=True, spare=WRITE_SPARE)]
Offset = Annotated[int, Query(description="bytes to skip", json_schema_extra={
    "minimum": 0, "maximum": MAX_FILE_OFFSET})]
Limit = Annotated[int | None, Query(description="bytes to read at most (default: all)",
                                    json_schema_extra={"exclusiveMinimum": 0,
                                                       "maximum": MAX_FILE_OFFSET}),
                  positive("limit", MAX_FILE_OFFSET, integer=True, allow_none=True)]
Mode = Annotated[int, Query(description="permission bits of a new file", json_schema_extra={
    "minimum": 0, "maximum": MAX_MODE})]
Owner = Annotated[str | None, Query(description="the account a new file (and the "
                                    "directories made for it) belongs to (default root)",
                                    json_schema_extra={"pattern": validate.USER_NAME_PATTERN}),
                  AfterValidator(validate.user)]
Depth = Annotated[int, Query(description="levels below `path` to list", json_schema_extra={
    "minimum": 1, "maximum": MAX_DEPTH}), positive("depth", MAX_DEPTH, integer=True)]


@router.get("/content", response_class=StreamingResponse, responses=_BYTES_DOC)
def download(sandbox_id: SandboxId, state: State, path: File, offset: Offset = 0,
             limit: Limit = None) -> StreamingResponse:
    # The engine reads the first chunk eagerly: a missing file is a 404 status, not a
    # broken stream. The rest is pulled chunk by chunk as the client reads.
    chunks = state.provider.read_file(sandbox_id, path, offset=offset, limit=limit)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.put("/content", openapi_extra={"requestBody": {
    "content": {"application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}}})
async def upload(sandbox_id: SandboxId, state: State, request: Request, path: NewFile,
                 who: Caller, mode: Mode = 0o644, user: Owner = None) -> Written:
    chunks = request_chunks(request.stream())

    def write() -> int:
        with state.quotas.upload_slot(who.key):  # it holds a thread while the client sends
            return state.provider.write_file(sandbox_id, path, chunks, mode=mode, user=user)

    size = await anyio.to_thread.run_sync(write)
    return Written(size=size)


@router.get("")
def list_files(sandbox_id: SandboxId, state: State, path: FilePath,
               depth: Depth = 1) -> list[EntryInfo]:
    return state.provider.list_files(sandbox_id, path, depth=depth)


@router.get("/stat")
def stat(sandbox_id: SandboxId, state: State, path: FilePath) -> EntryInfo:
    return state.provider.stat(sandbox_id, path)


@router.get("/exists")
def exists(sandbox_id: SandboxId, state: State, path: FilePath) -> Exists:
    return Exists(exists=state.provider.exists(sandbox_id, path))


@router.post("/mkdir", status_code=204)
def make_dir(sandbox_id: SandboxId, state: State, body: MakeDir) -> Response:
    state.provider.make_dir(sandbox_id, body.path, user=body.user)
    return Response(status_code=204)


@router.delete("", status_code=204)
def remove(sandbox_id: SandboxId, state: State, path: File) -> Response:
    state.provider.remove(sandbox_id, path)
    return Response(status_code=204)


@router.post("/rename", status_code=204)
def rename(sandbox_id: SandboxId, state: State, body: RenameBody) -> Response:
    state.provider.rename(sandbox_id, body.src, body.dst)
    return Response(status_code=204)
