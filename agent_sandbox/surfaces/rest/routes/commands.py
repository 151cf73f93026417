"""/v1/sandboxes/{id}/commands and /processes: foreground runs (one JSON result, or NDJSON
output events when ``stream`` is set), background processes, stdin, signals."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from fastapi.responses import StreamingResponse

from agent_sandbox.core.bounds import MAX_PID
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.models import CommandResult, ProcessInfo, ProcessOutput
from agent_sandbox.surfaces.http.streaming import RunFn, ndjson_events
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State
from agent_sandbox.surfaces.rest.schemas import (
    CustomCommand,
    Killed,
    KillProcess,
    RunCommand,
    SendStdin,
    Started,
    StartProcess,
    WaitProcess,
    base64_bytes,
    positive,
)

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}", tags=["commands"])
Pid = Annotated[int, Path(description="process id inside the sandbox",
                          json_schema_extra={"minimum": 1, "maximum": MAX_PID}),
                positive("pid", MAX_PID, integer=True)]
_NDJSON = "application/x-ndjson"
_STREAM_DOC: dict[int | str, dict[str, Any]] = {200: {"content": {_NDJSON: {}}}}


def _bytes(text: str | None, b64: str | None, what: str) -> str | bytes | None:
    if text is not None and b64 is not None:
        raise InvalidArgumentError(f"give {what} or {what}_base64, not both")
    if b64 is None:
        return text
    return base64_bytes(b64, f"{what}_base64")


def _streamed(run: RunFn, slot: Any = None) -> StreamingResponse:
    return StreamingResponse(ndjson_events(run, slot), media_type=_NDJSON,
                             headers={"X-Accel-Buffering": "no"})


@router.post("/commands", responses=_STREAM_DOC)
def run_command(sandbox_id: SandboxId, body: RunCommand, state: State,
                who: Caller) -> CommandResult:
    stdin = _bytes(body.stdin, body.stdin_base64, "stdin")
    kw = {"cwd": body.cwd, "envs": body.envs, "timeout": body.timeout, "stdin": stdin,
          "user": body.user}
    slot = state.quotas.command_slot(who.key)
    if body.stream:
        slot.__enter__()  # 429 now, as a status; released when the command ends
        return _streamed(lambda out, err: state.provider.run(  # type: ignore[return-value]
            sandbox_id, body.cmd, on_stdout=out, on_stderr=err, **kw), slot)
    with slot:
        return state.provider.run(sandbox_id, body.cmd, **kw)


@router.post("/processes", status_code=201)
def start_process(sandbox_id: SandboxId, body: StartProcess, state: State) -> Started:
    return Started(pid=state.provider.start(sandbox_id, body.cmd, cwd=body.cwd, envs=body.envs,
                                            user=body.user))


@router.get("/processes")
def list_processes(sandbox_id: SandboxId, state: State) -> list[ProcessInfo]:
    return state.provider.processes(sandbox_id)


@router.get("/processes/{pid}/output")
def process_output(sandbox_id: SandboxId, pid: Pid, state: State) -> ProcessOutput:
    return state.provider.process_output(sandbox_id, pid)


@router.post("/processes/{pid}/wait", responses=_STREAM_DOC)
def wait_process(sandbox_id: SandboxId, pid: Pid, body: WaitProcess,
                 state: State) -> CommandResult:
    if body.stream:
        return _streamed(lambda out, err: state.provider.wait(  # type: ignore[return-value]
            sandbox_id, pid, timeout=body.timeout, on_stdout=out, on_stderr=err))
    return state.provider.wait(sandbox_id, pid, timeout=body.timeout)


@router.post("/processes/{pid}/kill")
def kill_process(sandbox_id: SandboxId, pid: Pid, body: KillProcess, state: State) -> Killed:
    return Killed(killed=state.provider.kill_process(sandbox_id, pid, int(body.signal)))


@router.post("/processes/{pid}/stdin", status_code=204)
def send_stdin(sandbox_id: SandboxId, pid: Pid, body: SendStdin, state: State) -> Response:
    data = _bytes(body.data, body.data_base64, "data")
    state.provider.send_stdin(sandbox_id, pid, data if data is not None else b"",
                            close=body.close)
    return Response(status_code=204)


@router.post("/custom/{name}")
def custom_command(sandbox_id: SandboxId, name: str, body: CustomCommand, state: State,
                   who: Caller) -> CommandResult:
    with state.quotas.command_slot(who.key):
        return state.provider.custom(sandbox_id, name, body.args)
