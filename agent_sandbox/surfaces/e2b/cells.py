"""A code interpreter cell as E2B's ``/execute`` streams it: one JSON object a line, typed
``stdout`` / ``stderr`` (text, timestamp), ``result`` (one attribute per format, as
``e2b_code_interpreter.models.Result`` takes them), ``error`` (name, value, traceback),
``number_of_executions``, then ``end_of_execution``. Runs on the provider's ``run_code`` in
a ``work_events`` thread."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import threading
import time
from collections import OrderedDict
from typing import Any

from agent_sandbox.core import code_languages
from agent_sandbox.core.cancel import detached
from agent_sandbox.core.errors import InvalidArgumentError, SandboxError
from agent_sandbox.core.models import Execution, Result
from agent_sandbox.surfaces.e2b.envd.paths import DEFAULT_USER, home
from agent_sandbox.surfaces.e2b.target import Target
from agent_sandbox.surfaces.http.streaming import Emit, WorkFn
from agent_sandbox.surfaces.rest.routes.code import outcome

END = {"type": "end_of_execution"}
_STARTED = {"type": "started"}  # the work's first event, never sent (see interpreter)
_DONE = "abx_execution"
# Client-side deadlines end a cell: the SDK's `timeout` closes the connection, which
# interrupts it. This only bounds a client that waits for ever.
_CELL_LIMIT = 24 * 3600.0
_SETUP_CELL_TIMEOUT = 60.0  # also what a kernel has to start (in the first)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
_MAX_ENV = 1 << 20
# E2B's kernels start in its default user's home, where envd puts relative paths too
# (files.write("data.csv") then open("data.csv") in a cell). Ours start in the template's
# workdir: the default context is moved there once per kernel (a marker in the kernel says
# it was; this process remembers which sandboxes it did, a bounded record that only saves
# the extra cell), created contexts start there.
HOME = home(DEFAULT_USER)
_TO_HOME = ("(lambda os: None if getattr(os, '_abx_e2b_home', False) or not os.path.isdir("
            f"{HOME!r}) else (os.chdir({HOME!r}), setattr(os, '_abx_e2b_home', True)) and None"
            ")(__import__('os'))")
# The other languages' default contexts, moved home by a cell of their own (as E2B's
# server does for every context it makes); Python's is hidden from the count (below).
_TO_HOME_IN = {
    "javascript": f"try {{ Deno.chdir({json.dumps(HOME)}) }} catch {{}}",
    "typescript": f"try {{ Deno.chdir({json.dumps(HOME)}) }} catch {{}}",
    "bash": f"cd {HOME} 2>/dev/null; true",
    "r": f"invisible(try(setwd({json.dumps(HOME)}), silent = TRUE))",
}
# Appended to each hidden cell: IPython counts a cell when it ends, so taking one off while
# it runs leaves the count where the user's last cell left it (E2B's execution_count). Its
# value is None: nothing is displayed, and `_` stays the user's.
_UNCOUNTED = ("; (lambda ip: None if ip is None else setattr(ip, 'execution_count', "
              "ip.execution_count - 1))(globals().get('get_ipython', lambda: None)())")


def hidden(code: str) -> str:
    """``code`` as a cell the user's ``execution_count`` does not see."""
    return code + _UNCOUNTED


_homed: OrderedDict[tuple[str, str], None] = OrderedDict()
_homed_lock = threading.Lock()
_MAX_HOMED = 4096


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


def _env_cells(env: dict[str, str], language: str = code_languages.PYTHON
               ) -> tuple[str, str]:
    """Cells that set ``env`` in the kernel's environment (what the cell and its
    subprocesses see) and put the old values back after. Python's bind no name of the
    user's (``repr`` makes each string a Python literal, whatever it holds); the other
    languages' keep the old values in one name of their own (``__abx_*``), their strings
    quoted for the language (JSON for JavaScript and R; ``shlex`` for Bash)."""
    if language != code_languages.PYTHON:
        return _other_env_cells(env, language)
    setup = ("__import__('os')._abx_cell_env = (lambda e, new: ({k: e.get(k) for k in new}, "
             f"e.update(new))[0])(__import__('os').environ, {env!r})")
    restore = ("(lambda e, old: [e.pop(k, None) if v is None else e.__setitem__(k, v) "
               "for k, v in old.items()].clear())(__import__('os').environ, "
               "__import__('os').__dict__.pop('_abx_cell_env', {}))")
    return hidden(setup), hidden(restore)


def _other_env_cells(env: dict[str, str], language: str) -> tuple[str, str]:
    names = list(env)
    if language == "bash":  # names are checked: [A-Za-z_][A-Za-z0-9_]*
        setup = "; ".join(f"__abx_set_{k}=${{{k}+x}}; __abx_old_{k}=${k}; "
                          f"export {k}={shlex.quote(v)}" for k, v in env.items())
        restore = "; ".join(f'if [ -n "$__abx_set_{k}" ]; then export {k}="$__abx_old_{k}"; '
                            f"else unset {k}; fi; unset __abx_set_{k} __abx_old_{k}"
                            for k in names)
        return setup + "; true", restore + "; true"
    if language == "r":
        values = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
        setup = (f".__abx_env <- Sys.getenv(c({', '.join(map(json.dumps, names))}), "
                 f"unset = NA, names = TRUE); invisible(Sys.setenv({values}))")
        restore = ("invisible(for (k in names(.__abx_env)) if (is.na(.__abx_env[[k]])) "
                   "Sys.unsetenv(k) else do.call(Sys.setenv, setNames(list(.__abx_env[[k]]),"
                   " k))); rm(.__abx_env)")
        return setup, restore
    # JavaScript and TypeScript (Deno; process.env reads the same environment)
    setup = ("void (globalThis.__abxCellEnv = Object.fromEntries(Object.entries("
             f"{json.dumps(env)}).map(([k, v]) => {{ const old = Deno.env.get(k); "
             "Deno.env.set(k, v); return [k, old ?? null] })))")
    restore = ("void (Object.entries(globalThis.__abxCellEnv ?? {}).forEach(([k, v]) => "
               "v === null ? Deno.env.delete(k) : Deno.env.set(k, v)), "
               "delete globalThis.__abxCellEnv)")
    return setup, restore


def make_home(found: Target) -> str:
    """The default user's home, made if the sandbox has none yet (the guest makes the
    account and its home on its first use)."""
    found.provider.run(found.sandbox_id, "true", timeout=60, user=DEFAULT_USER)
    return HOME


def forget_home(sandbox_id: str, ctx: str) -> None:
    """A default context's kernel is a new one: move it home again before its next cell."""
    with _homed_lock:
        _homed.pop((sandbox_id, ctx), None)


def _go_home(found: Target, ctx: str, language: str) -> None:
    key = (found.sandbox_id, ctx)
    with _homed_lock:
        if code_languages.default_language(ctx) is None or key in _homed:
            return
    with contextlib.suppress(SandboxError):  # no home: the cell below leaves the cwd be
        make_home(found)
    to_home = hidden(_TO_HOME) if language == code_languages.PYTHON else _TO_HOME_IN[language]
    found.provider.run_code(found.sandbox_id, to_home, timeout=_SETUP_CELL_TIMEOUT,
                            context=ctx)
    with _homed_lock:
        _homed[key] = None
        while len(_homed) > _MAX_HOMED:
            _homed.popitem(last=False)


def work(found: Target, code: str, ctx: str, env: dict[str, str],
         language: str = code_languages.PYTHON) -> WorkFn:
    """The cell as ``work_events`` work: its output as it comes, the execution last."""
    provider, sandbox_id = found.provider, found.sandbox_id
    setup, restore = _env_cells(env, language)

    def run(emit: Emit) -> dict[str, Any]:
        emit(_STARTED)
        _go_home(found, ctx, language)
        if env:
            done = provider.run_code(sandbox_id, setup, timeout=_SETUP_CELL_TIMEOUT, context=ctx)
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
                    provider.run_code(sandbox_id, restore, timeout=_SETUP_CELL_TIMEOUT,
                                      context=ctx)
        found.state.metrics.code_run(outcome(execution))
        if execution.kernel_restarted:
            forget_home(sandbox_id, ctx)
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
    event = {"type": "result", "text": _unquoted(res.text), "html": res.html,
             "markdown": res.markdown, "svg": res.svg, "png": res.png, "jpeg": res.jpeg,
             "pdf": res.pdf, "latex": res.latex, "json": res.json_data,
             "javascript": res.javascript, "data": res.data, "chart": res.chart,
             "extra": res.extra, "is_main_result": res.is_main_result}
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


def ended_in_error(event: dict[str, Any]) -> bool:
    """``event`` is the cell's end, with an error (the kernel's connection lost too)."""
    return event.get("type") == _DONE and event["execution"].error is not None


def lines(event: dict[str, Any]) -> list[bytes]:
    """What ``event`` (from ``work``) is on the wire."""
    if event.get("type") == _DONE:
        return [line(e) for e in _summary(event["execution"])]
    return [line(event)]


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"
