"""/v1/sandboxes/{id}/code: cells in stateful Jupyter kernels (one JSON execution, or NDJSON
events when ``stream`` is set), and code contexts (independent interpreters)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Path, Response

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.models import CodeContext, Execution, Result
from agent_sandbox.surfaces.http.streaming import NDJSON, Emit, ndjson_response
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State
from agent_sandbox.surfaces.rest.schemas import CODE_CONTEXT_PATTERN, CreateCodeContext, RunCode

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/code", tags=["code"])
ContextId = Annotated[str, Path(description="code context id, or `default`",
                                json_schema_extra={"pattern": CODE_CONTEXT_PATTERN})]


def _event(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {name: schema}, "required": [name],
            "additionalProperties": False}


_STREAM_DOC: dict[int | str, dict[str, Any]] = {200: {
    "description": "the execution; with `stream`, NDJSON lines: `stdout` / `stderr` text and "
                   "`result` display items as the cell produces them, then one `execution` "
                   "(the summary: stdout, stderr, error with its traceback, execution count; "
                   "`results` left empty, they were sent before) or one `error` line",
    "content": {NDJSON: {"schema": {"oneOf": [
        _event("stdout", {"type": "string"}), _event("stderr", {"type": "string"}),
        _event("result", {"$ref": "#/components/schemas/Result"}),
        _event("execution", {"$ref": "#/components/schemas/Execution"}),
        _event("error", {"$ref": "#/components/schemas/ErrorBody"})]}}}}}


def outcome(execution: Execution) -> str:
    if execution.error is None:
        return "ok"
    return "timeout" if execution.error.name == "TimeoutError" else "error"


@router.post("", responses=_STREAM_DOC)
async def run_code(sandbox_id: SandboxId, body: RunCode, state: State,
                   who: Caller) -> Execution:
    """Run a cell in a context's kernel (started on first use; variables kept between
    calls). Needs a template with a kernel, such as `code-interpreter-v1` (409 otherwise).
    A cell past `timeout` is interrupted: the execution's error is a `TimeoutError`."""
    kw = {"language": body.language, "timeout": body.timeout, "context": body.context}
    slot = state.quotas.command_slot(who.key)

    def execute(emit: Emit | None) -> Execution:
        out = (lambda t: emit({"stdout": t})) if emit else None
        err = (lambda t: emit({"stderr": t})) if emit else None
        res = (lambda r: emit({"result": _dump(r)})) if emit else None
        try:
            execution = state.provider.run_code(sandbox_id, body.code, on_stdout=out,
                                              on_stderr=err, on_result=res, **kw)
        except SandboxError:
            state.metrics.code_run("failed")
            raise
        state.metrics.code_run(outcome(execution))
        return execution

    if body.stream:
        slot.__enter__()  # 429 now, as a status; released when the cell ends
        # The results went out as events: the summary does not send them twice.
        return await ndjson_response(  # type: ignore[return-value]
            lambda emit: {"execution": _dump(execute(emit).model_copy(update={"results": []}))},
            slot)

    def blocking() -> Execution:
        with slot:
            return execute(None)

    return await anyio.to_thread.run_sync(blocking)


def _dump(model: Result | Execution) -> dict[str, Any]:
    # by_alias: a result's JSON data is `json`, as in the non-streamed answer.
    return model.model_dump(mode="json", by_alias=True)


@router.get("/contexts")
def list_code_contexts(sandbox_id: SandboxId, state: State) -> list[CodeContext]:
    """The sandbox's code contexts (`default` once it has run a cell)."""
    return state.provider.list_code_contexts(sandbox_id)


@router.post("/contexts", status_code=201)
def create_code_context(sandbox_id: SandboxId, body: CreateCodeContext,
                        state: State) -> CodeContext:
    """A new, independent interpreter (its own kernel, started now), run as `user` (an
    account of the sandbox) if given."""
    return state.provider.create_code_context(sandbox_id, cwd=body.cwd, language=body.language,
                                              **({"user": body.user} if body.user else {}))


@router.post("/contexts/{context_id}/restart", status_code=204)
def restart_code_context(sandbox_id: SandboxId, context_id: ContextId,
                         state: State) -> Response:
    """A fresh kernel for the context: its variables are lost, its cwd kept."""
    state.provider.restart_code_context(sandbox_id, context_id)
    return Response(status_code=204)


@router.delete("/contexts/{context_id}", status_code=204)
def remove_code_context(sandbox_id: SandboxId, context_id: ContextId,
                        state: State) -> Response:
    """End the context's kernel and forget the context (`default` comes back, fresh, with
    the next cell that names no context)."""
    state.provider.remove_code_context(sandbox_id, context_id)
    return Response(status_code=204)
