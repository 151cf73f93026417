"""A code interpreter cell as E2B's ``/execute`` streams it: one JSON object a line, typed
``stdout`` / ``stderr`` (text, timestamp), ``result`` (one attribute per format, as
``e2b_code_interpreter.models.Result`` takes them), ``error`` (name, value, traceback),
``number_of_executions``, then ``end_of_execution``. Runs on the provider's ``run_code`` in
a ``work_events`` thread."""

from __future__ import annotations

import contextlib
import json
import re
import time
from typing import Any

from agent_sandbox.cancel import detached
from agent_sandbox.errors import InvalidArgumentError, SandboxError
from agent_sandbox.models import Execution, Result
from agent_sandbox.server.e2b.target import Target
from agent_sandbox.server.routes.code import outcome
from agent_sandbox.server.streaming import Emit, WorkFn

END = {"type": "end_of_execution"}
_STARTED = {"type": "started"}  # the work's first event, never sent (see interpreter)
_DONE = "abx_execution"
# Client-side deadlines end a cell: the SDK's `timeout` closes the connection, which
# interrupts it. This only bounds a client that waits for ever.
_CELL_LIMIT = 24 * 3600.0
_ENV_CELL_TIMEOUT = 30.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
_MAX_ENV = 1 << 20


def env_vars(value: Any) -> dict[str, str]:
    """E2B's ``env_vars``: names and string values for this cell."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError("env_vars must be an object of names to string values")
    size = 0
    for name, text in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise InvalidArgumentError(f"env_vars: {str(name)[:60]!r} is not a variable name "
                                       "(letters, digits and _, not starting with a digit)")
        if not isinstance(text, str) or "\x00" in text:
            raise InvalidArgumentError(f"env_vars: {name} must be a string without NUL")
        size += len(name) + len(text)
    if size > _MAX_ENV:
        raise InvalidArgumentError(f"env_vars are over {_MAX_ENV >> 10} KiB")
    return value


def _env_cells(env: dict[str, str]) -> tuple[str, str]:
    """Cells that set ``env`` in the kernel's ``os.environ`` (what the cell and its
    subprocesses see) and put the old values back after, binding no name of the user's.
    ``repr`` makes each string a Python literal, whatever it holds."""
    setup = ("__import__('os')._abx_cell_env = (lambda e, new: ({k: e.get(k) for k in new}, "
             f"e.update(new))[0])(__import__('os').environ, {env!r})")
    restore = ("(lambda e, old: [e.pop(k, None) if v is None else e.__setitem__(k, v) "
               "for k, v in old.items()].clear())(__import__('os').environ, "
               "__import__('os').__dict__.pop('_abx_cell_env', {}))")
    return setup, restore


def work(found: Target, code: str, ctx: str, env: dict[str, str]) -> WorkFn:
    """The cell as ``work_events`` work: its output as it comes, the execution last."""
    provider, sandbox_id = found.provider, found.sandbox_id
    setup, restore = _env_cells(env)

    def run(emit: Emit) -> dict[str, Any]:
        emit(_STARTED)
        if env:
            done = provider.run_code(sandbox_id, setup, timeout=_ENV_CELL_TIMEOUT, context=ctx)
            if done.error is not None:
                return {"type": _DONE, "execution": done}
        try:
            execution = provider.run_code(
                sandbox_id, code, timeout=_CELL_LIMIT, context=ctx,
                on_stdout=lambda t: emit(_output("stdout", t)),
                on_stderr=lambda t: emit(_output("stderr", t)),
                on_result=lambda r: emit(result(r)))
        except SandboxError:
            found.state.metrics.code_run("failed")
            raise
        finally:
            if env:
                # Also after the client left (the cell was interrupted); a kernel gone by
                # now took the variables with it.
                with detached(), contextlib.suppress(SandboxError):
                    provider.run_code(sandbox_id, restore, timeout=_ENV_CELL_TIMEOUT,
                                      context=ctx)
        found.state.metrics.code_run(outcome(execution))
        return {"type": _DONE, "execution": execution}

    return run


def _output(stream: str, text: str) -> dict[str, Any]:
    return {"type": stream, "text": text, "timestamp": time.time_ns()}


def _unquoted(text: str | None) -> str | None:
    # E2B's server drops the quotes of a string's repr: `'hi'` is given as `hi`.
    if text and len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def result(res: Result) -> dict[str, Any]:
    extra = dict(res.extra)
    event = {"type": "result", "text": _unquoted(res.text), "html": res.html,
             "markdown": res.markdown, "svg": res.svg, "png": res.png, "jpeg": res.jpeg,
             "pdf": res.pdf, "latex": res.latex, "json": res.json_data,
             "javascript": res.javascript,
             # What E2B's own formatters add (DataFrames, charts), if a kernel sends them.
             "data": extra.pop("e2b/data", None), "chart": extra.pop("e2b/chart", None),
             "extra": extra, "is_main_result": res.is_main_result}
    return {k: v for k, v in event.items() if v is not None}


def failure(exc: SandboxError) -> dict[str, Any]:
    """The gateway could not run the cell (after the answer's status went out)."""
    return {"type": "error", "name": type(exc).__name__, "value": exc.message,
            "traceback": ""}


def _summary(execution: Execution) -> list[dict[str, Any]]:
    out = []
    if execution.kernel_restarted:
        out.append(_output("stderr", "[the context's kernel had stopped and was started "
                                     "again: its variables were lost]\n"))
    if execution.truncated:
        out.append(_output("stderr", "[output past the per-cell limit was dropped]\n"))
    if execution.error is not None:
        err = execution.error
        out.append({"type": "error", "name": err.name, "value": err.value,
                    "traceback": err.traceback})
    if execution.execution_count is not None:
        out.append({"type": "number_of_executions",
                    "execution_count": execution.execution_count})
    return out


def lines(event: dict[str, Any]) -> list[bytes]:
    """What ``event`` (from ``work``) is on the wire."""
    if event.get("type") == _DONE:
        return [line(e) for e in _summary(event["execution"])]
    return [line(event)]


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"
