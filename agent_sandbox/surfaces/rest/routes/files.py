"""/v1/sandboxes/{id}/files: streamed upload and download, listing, metadata, changes."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator

from agent_sandbox.core import validate
from agent_sandbox.core.bounds import (
    MAX_DEPTH,
    MAX_FILE_OFFSET,
    MAX_LOCK_TOKEN,
    MAX_LOCK_WAIT,
    MAX_MODE,
    MAX_VERSION,
)
from agent_sandbox.core.models import EntryInfo, FileLock
from agent_sandbox.surfaces.http.auth import Principal
from agent_sandbox.surfaces.http.streaming import metadata_headers, request_chunks
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State
from agent_sandbox.surfaces.rest.schemas import (
    HOLDER_PATTERN,
    WRITE_SPARE,
    Exists,
    LockBody,
    MakeDir,
    Released,
    RenameBody,
    UnlockBody,
    Written,
    absolute,
    path_schema,
    positive,
)

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
IfMatch = Annotated[str | None, Query(description="write only if the file is still at "
                                      "this version (a read's ETag, a listing's version); "
                                      "else 412 conflict. The If-Match header does the same",
                                      max_length=MAX_VERSION,
                                      pattern=validate.OPAQUE_PATTERN)]
LockWait = Annotated[float | None, Query(description="seconds to wait for another write or "
                                         "lock of the file to end (default 3), else 423 "
                                         "locked with Retry-After", ge=0, le=MAX_LOCK_WAIT)]
LockToken = Annotated[str | None, Query(description="the token of your own lock on the "
                                        "file (POST .../files/lock); the X-Abx-Lock-Token "
                                        "header does the same, and stays out of access logs",
                                        max_length=MAX_LOCK_TOKEN,
                                        pattern=validate.OPAQUE_PATTERN)]
Depth = Annotated[int, Query(description="levels below `path` to list", json_schema_extra={
    "minimum": 1, "maximum": MAX_DEPTH}), positive("depth", MAX_DEPTH, integer=True)]


@router.get("/content", response_class=StreamingResponse, responses=_BYTES_DOC)
def download(sandbox_id: SandboxId, state: State, path: File, offset: Offset = 0,
             limit: Limit = None) -> StreamingResponse:
    # The engine reads the first chunk eagerly: a missing file is a 404 status, not a
    # broken stream. The rest is pulled chunk by chunk as the client reads.
    chunks = state.provider.read_file(sandbox_id, path, offset=offset, limit=limit)
    version = getattr(chunks, "version", None)  # what PUT's if_match (or If-Match) names
    return StreamingResponse(chunks, media_type="application/octet-stream",
                             headers={"ETag": f'"{version}"'} if version else None)


@router.put("/content", openapi_extra={"requestBody": {
    "content": {"application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}}})
async def upload(sandbox_id: SandboxId, state: State, request: Request, path: NewFile,
                 who: Caller, mode: Mode = 0o644, user: Owner = None,
                 if_match: IfMatch = None, lock_wait: LockWait = None,
                 lock_token: LockToken = None) -> Written:
    header = request.headers.get("if-match")
    if if_match is None and header:
        if_match = header.strip().removeprefix("W/").strip('"')
    # A header keeps the token out of access logs, which print the query.
    lock_token = lock_token or request.headers.get("x-abx-lock-token") or None
    metadata = metadata_headers(request.headers)  # X-Metadata-<key>: <value>
    chunks = request_chunks(request.stream())

    def write() -> int:
        with state.quotas.upload_slot(who.key):  # it holds a thread while the client sends
            return state.provider.write_file(sandbox_id, path, chunks, mode=mode, user=user,
                                             if_match=if_match, lock_wait=lock_wait,
                                             lock_token=lock_token, metadata=metadata)

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


def _holder(who: Principal, name: str | None) -> str:
    """A lock's holder: the API key's name first, so one key cannot pass for another."""
    key = who.key.name if who.key is not None else "open gateway"
    return f"{key}: {name or 'rest'}"


@router.post("/lock")
def lock(sandbox_id: SandboxId, state: State, who: Caller, body: LockBody) -> FileLock:
    """Lock a file for a longer edit: writes without the token get 423 locked (with the
    holder and the time left) until it is unlocked, expires or is renewed."""
    with state.quotas.lock_slot(who.key):
        return state.provider.lock_file(sandbox_id, body.path, body.ttl,
                                        holder=_holder(who, body.holder), wait=body.wait,
                                        token=body.token)


@router.post("/unlock", status_code=204)
def unlock(sandbox_id: SandboxId, state: State, body: UnlockBody) -> Response:
    state.provider.unlock_file(sandbox_id, body.path, body.token)
    return Response(status_code=204)


@router.delete("/locks")
def release_locks(sandbox_id: SandboxId, state: State, who: Caller,
                  holder: Annotated[str, Query(min_length=1, max_length=120,
                                               pattern=HOLDER_PATTERN,
                                               description="the holder name the locks "
                                               "were taken with")]) -> Released:
    """Release every lock of a holder (a client's session ended)."""
    return Released(released=state.provider.release_locks(sandbox_id, _holder(who, holder)))
