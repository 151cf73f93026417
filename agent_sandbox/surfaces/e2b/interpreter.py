"""The code interpreter's API (port 49999 of E2B's ``code-interpreter-v1`` template), served
from the gateway's provider: ``/execute`` streams a cell's output as the NDJSON lines
``e2b_code_interpreter`` parses (``cells``), ``/contexts`` manages independent kernels.
Errors are E2B's: a status and a plain-text message (the SDK shows the text; 404 becomes its
``NotFoundException``)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_sandbox.core import code_languages, validate
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    SandboxError,
    WrongStateError,
)
from agent_sandbox.core.models import CodeContext
from agent_sandbox.surfaces.e2b import cells, target
from agent_sandbox.surfaces.http.errors import log
from agent_sandbox.surfaces.http.streaming import NDJSON, work_events

T = TypeVar("T")
_MAX_BODY = 8 << 20  # a cell's code and its env_vars
_BOOT_LANGUAGES = (code_languages.PYTHON, "javascript")  # E2B's server starts their kernels


async def _blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object the SDK sent, read up to ``_MAX_BODY`` bytes."""
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > _MAX_BODY:
            raise InvalidArgumentError(f"the request body is over {_MAX_BODY >> 20} MiB: "
                                       "send large code or data as a file")
        parts.append(chunk)
    try:
        body = json.loads(b"".join(parts) or b"{}")
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise InvalidArgumentError("the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    return body


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string")
    return value


def _check_kernel(found: target.Target) -> list[str]:
    """The languages of the sandbox's template, or a clear answer for one without a kernel
    (E2B's ``base``)."""
    info = found.provider.info(found.sandbox_id)
    for tmpl in found.provider.list_templates():
        if tmpl.name == info.template and not tmpl.has_kernel:
            raise WrongStateError(
                f"sandbox {found.sandbox_id} was created from template {info.template!r}, "
                "which has no code interpreter: create it from 'code-interpreter-v1' (what "
                "e2b_code_interpreter's Sandbox.create() uses) or a template built on it")
        if tmpl.name == info.template:
            return tmpl.languages
    return []  # not among the templates listed: nothing known of its kernels


def _context_id(value: str | None, found: target.Target) -> str:
    """A context of this sandbox (``default`` when none is named), or a 404."""
    try:
        ctx = validate.code_context(value)
    except InvalidArgumentError:
        ctx = None
    if ctx is None or (code_languages.default_language(ctx) is None and ctx not in {
            c.id for c in found.provider.list_code_contexts(found.sandbox_id)}):
        raise NotFoundError(f"Context {str(value)[:80]} not found (see list_code_contexts)")
    return ctx


def _context(ctx: CodeContext) -> dict[str, str]:
    return {"id": ctx.id, "language": ctx.language, "cwd": ctx.cwd}


async def _execute(request: Request) -> Response:
    found = target.current()
    body = await _body(request)
    code = _text(body, "code")
    if code is None:
        raise InvalidArgumentError("code is required: the cell's source, a string")
    if body.get("context_id") is not None and body.get("language") is not None:
        raise InvalidArgumentError("Only one of context_id or language can be provided")
    language = code_languages.code_language(body.get("language"))
    env = cells.env_vars(body.get("env_vars"))

    def preflight() -> tuple[str, str, Any]:
        _check_kernel(found)
        if body.get("context_id") is None:  # the language's own default context
            ctx, lang = code_languages.default_context(language), language
        else:
            ctx = _context_id(_text(body, "context_id"), found)
            lang = next((c.language for c in found.provider.list_code_contexts(
                found.sandbox_id) if c.id == ctx), code_languages.default_language(ctx))
        return ctx, lang or code_languages.PYTHON, found.api_key()

    ctx, lang, key = await _blocking(preflight)
    work = cells.work(found, code, ctx, env, lang)
    slot = found.state.quotas.command_slot(key)
    slot.__enter__()  # over quota: a 429 now; the work releases it when it ends
    events = work_events(work, slot)
    # Its first event comes at once: the work runs (and owns the slot) before the response
    # does, and a response that never starts still ends it (the generator's finalizer).
    await events.__anext__()
    return StreamingResponse(_lines(events, found), media_type=NDJSON,
                             headers={"X-Accel-Buffering": "no"})


async def _lines(events: AsyncGenerator[dict[str, Any]],
                 found: target.Target) -> AsyncIterator[bytes]:
    """The cell's events as NDJSON; a failure after the first line is an ``error`` line (the
    status went out), unless the sandbox is gone: then the response is cut, as E2B's is,
    and the SDK raises that the sandbox was killed. A client that leaves interrupts the
    cell (``work_events``)."""
    try:
        async with aclosing(events):  # ended here, not by a finalizer, when the stream is cut
            async for event in events:
                if cells.ended_in_error(event) and not await target.still_running(found):
                    raise target.SandboxLost  # its kernel went with it
                for line in cells.lines(event):
                    yield line
    except SandboxError as exc:
        if not await target.still_running(found):
            raise target.SandboxLost from None
        yield cells.line(cells.failure(exc))
    yield cells.line(cells.END)


async def _create_context(request: Request) -> JSONResponse:
    found = target.current()
    body = await _body(request)
    language = code_languages.code_language(body.get("language"))
    cwd = _text(body, "cwd")

    def create() -> CodeContext:
        _check_kernel(found)
        return found.provider.create_code_context(
            found.sandbox_id, cwd=cwd or cells.make_home(found), language=language)

    return JSONResponse(_context(await _blocking(create)))


async def _list_contexts(_: Request) -> JSONResponse:
    """The sandbox's contexts. E2B's server starts Python's and JavaScript's default
    contexts as the sandbox boots, so its list always has them; ours start with their
    first cell, and are listed before that all the same (in the home they move to)."""
    found = target.current()

    def listed() -> list[CodeContext]:
        languages = _check_kernel(found)
        contexts = found.provider.list_code_contexts(found.sandbox_id)
        started = {c.id for c in contexts}
        boot = [CodeContext(id=code_languages.default_context(lang), language=lang,
                            cwd=cells.HOME) for lang in _BOOT_LANGUAGES
                if lang in languages and code_languages.default_context(lang) not in started]
        return boot + contexts

    return JSONResponse([_context(c) for c in await _blocking(listed)])


def _on_context(act: str) -> Callable[[Request], Awaitable[Response]]:
    """DELETE /contexts/{id} (``act`` "remove") or POST /contexts/{id}/restart ("restart"):
    the kernel ends (and restarts); the default context's working directory is set again
    by its next cell."""

    async def handle(request: Request) -> Response:
        found = target.current()

        def run() -> None:
            _check_kernel(found)
            ctx = _context_id(request.path_params["context_id"], found)
            getattr(found.provider, f"{act}_code_context")(found.sandbox_id, ctx)
            cells.forget_home(found.sandbox_id, ctx)

        await _blocking(run)
        return Response(status_code=204)

    return handle


async def _health(_: Request) -> JSONResponse:
    return JSONResponse("OK")


async def _refused(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandboxError)
    return PlainTextResponse(exc.message, status_code=exc.http_status)


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405):
        return PlainTextResponse(
            f"{request.method} {request.url.path[:200]} is not part of the code interpreter "
            "API served here (see docs/e2b.md)", status_code=exc.status_code)
    return PlainTextResponse(str(exc.detail), status_code=exc.status_code)


async def _unexpected(_: Request, exc: Exception) -> Response:
    if isinstance(exc, target.SandboxLost):  # for the router: not an error of ours
        raise exc
    log.error("unexpected error in the E2B code interpreter API", exc_info=exc)
    return PlainTextResponse(f"internal error: {type(exc).__name__}", status_code=500)


def application() -> Starlette:
    return Starlette(routes=[
        Route("/health", _health, methods=["GET"]),
        Route("/execute", _execute, methods=["POST"]),
        Route("/contexts", _create_context, methods=["POST"]),
        Route("/contexts", _list_contexts, methods=["GET"]),
        Route("/contexts/{context_id}", _on_context("remove"), methods=["DELETE"]),
        Route("/contexts/{context_id}/restart", _on_context("restart"), methods=["POST"]),
    ], exception_handlers={SandboxError: _refused, HTTPException: _http,
                           Exception: _unexpected})
