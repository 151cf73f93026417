"""envd's ``GET /files`` (a file's bytes, streamed) and ``POST /files`` (uploads:
``multipart/form-data`` with one or more files, or, as envd >= 0.5.7 takes it, a raw
``application/octet-stream`` body, gzip-encoded or not), on the provider's streamed
``read_file`` / ``write_file``: no file is held whole by the gateway, in memory or on disk.

``path`` is absolute or relative to the home of ``username`` (E2B's default ``user``); a
multipart part without ``?path=`` is written to its filename. ``X-Metadata-<key>`` headers
are every file's metadata (its ``user.e2b.*`` xattrs, replacing any it had, as envd >=
0.6.2); each written file's entry gives back what it keeps. Errors are envd's
``{code, message}`` with the HTTP status (404: no such file)."""

from __future__ import annotations

import posixpath
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_sandbox.core.errors import InvalidArgumentError, SandboxError
from agent_sandbox.surfaces.e2b import target
from agent_sandbox.surfaces.e2b.envd import paths
from agent_sandbox.surfaces.e2b.envd.errors import http_error, http_sandbox_error
from agent_sandbox.surfaces.e2b.envd.multipart import MultipartReader, boundary
from agent_sandbox.surfaces.http.errors import log
from agent_sandbox.surfaces.http.streaming import metadata_headers, request_chunks

_PIECE = 1 << 20  # bytes of decompressed upload passed on at a time


def _user(request: Request) -> str:
    """The request's user: ``?username=`` (what E2B's SDK sends for /files) or its Basic
    auth user, else E2B's default."""
    return paths.username(request.query_params.get("username") or target.current().user)


def _path(request: Request, given: str | None = None) -> str:
    """The request's ``path`` (or ``given``) resolved for its user."""
    path = request.query_params.get("path") if given is None else given
    if path is None:
        raise InvalidArgumentError("the 'path' query parameter is required (the file's "
                                   "path, absolute or relative to the user's home)")
    return paths.resolve(path, _user(request))


def _written(path: str, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": posixpath.basename(path), "type": "file", "path": path}
    if metadata:  # envd leaves it out when the file has none
        entry["metadata"] = metadata
    return entry


async def _answer(call: Callable[[], Any]) -> Any:
    """``call`` in a worker thread; our errors (and bugs) as envd's error bodies."""
    try:
        return await anyio.to_thread.run_sync(call)
    except SandboxError as exc:
        return http_sandbox_error(exc)
    except Exception:  # noqa: BLE001 - a clear 500, not a traceback
        log.exception("e2b envd /files failed")
        return http_error(500, "internal error (the gateway's log has the details)")


async def download(request: Request) -> Response:
    found = target.current()

    def open_file() -> StreamingResponse:
        path = _path(request)
        # The first chunk is read now: a missing file is a 404, not a broken stream.
        chunks = found.provider.read_file(found.sandbox_id, path)
        return StreamingResponse(chunks, media_type="application/octet-stream")

    return await _answer(open_file)


def gunzip(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """A gzip stream decompressed piece by piece (never more than ``_PIECE`` bytes at
    once, whatever the compression ratio)."""
    inflate = zlib.decompressobj(wbits=31)
    try:
        for chunk in chunks:
            data = chunk
            while data and not inflate.eof:
                out = inflate.decompress(data, _PIECE)
                data = inflate.unconsumed_tail
                if out:
                    yield out
        if not inflate.eof:
            raise InvalidArgumentError("the gzip-encoded upload ended early")
    except zlib.error as exc:
        raise InvalidArgumentError(f"the upload is not valid gzip: {exc}") from None


async def upload(request: Request) -> Response:
    found = target.current()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        return http_error(415, f"Content-Encoding {encoding[:40]!r} is not supported "
                               "(identity or gzip)")
    try:
        metadata = metadata_headers(request.headers)
    except SandboxError as exc:
        return http_sandbox_error(exc)
    body = request_chunks(request.stream())
    data = gunzip(body) if encoding == "gzip" else body

    def write(path: str, content: Iterator[bytes]) -> dict[str, Any]:
        # A new file is the user's, as in E2B: its commands (run as that user) may change it.
        found.provider.write_file(found.sandbox_id, path, content, user=_user(request),
                                  metadata=metadata)
        # What it keeps (none where the filesystem has no user xattrs), as envd reads back.
        kept = found.provider.stat(found.sandbox_id, path).metadata if metadata else None
        return _written(path, kept)

    def raw() -> JSONResponse:
        with found.state.quotas.upload_slot(found.api_key()):  # it holds a thread
            return JSONResponse([write(_path(request), data)])

    def multipart() -> JSONResponse:
        with found.state.quotas.upload_slot(found.api_key()):
            return _multipart()

    def _multipart() -> JSONResponse:
        given = request.query_params.get("path")
        written = []
        for part, content in MultipartReader(boundary(request.headers["content-type"]),
                                             data).parts():
            if part.name != "file":
                continue  # envd writes the parts named "file"
            name = given if given is not None else part.filename
            if not name:
                raise InvalidArgumentError("a file part needs a filename (its path in the "
                                           "sandbox), or give ?path=")
            written.append(write(_path(request, name), content))
        return JSONResponse(written)

    if kind == "application/octet-stream":
        return await _answer(raw)
    if kind == "multipart/form-data":
        return await _answer(multipart)
    return http_error(415, f"Content-Type {kind[:60]!r} is not supported: send the file as "
                           "application/octet-stream (with ?path=) or multipart/form-data")


routes: list[Route] = [Route("/files", download, methods=["GET"]),
                       Route("/files", upload, methods=["POST"])]
