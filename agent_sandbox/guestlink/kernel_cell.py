"""One ``run_code`` cell's output, built from bridge events that the sandbox controls.

Every field is type-checked (a wrong one is skipped, never raised), every string has its
lone surrogates replaced (they cannot be encoded as UTF-8 for any client), a result
nested deeper than ``MAX_DEPTH`` is dropped (no serializer downstream takes it), and
what a cell may keep on the host is capped at ``MAX_CELL_OUTPUT`` bytes (each event
charged what it costs parsed): past it, output is dropped and ``Execution.truncated``
says so. ``CellStop`` decides when a cell past its deadline, or whose call was cancelled,
is interrupted, and when its kernel is restarted instead.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import ValidationError

from agent_sandbox.core.cancel import CallCancel
from agent_sandbox.core.models import Execution, ExecutionError, Result

MAX_CELL_OUTPUT = 32 << 20
MAX_DEPTH = 64
_MAX_TRACEBACK = 256 * 1024
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SURROGATES = re.compile("[\ud800-\udfff]")

INTERRUPT_GRACE = 5.0  # after SIGINT, how long a cell has to stop before a restart
INTERRUPT_AGAIN = 0.5  # seconds between SIGINTs to a cell that runs on

TextCallback = Callable[[str], None]
ResultCallback = Callable[[Result], None]


def _text(value: Any, limit: int | None = None) -> str:
    text = value if isinstance(value, str) else ""
    return _SURROGATES.sub("\ufffd", text if limit is None else text[:limit])


class _TooDeep(ValueError):
    pass


def _clean(value: Any, depth: int = 0) -> Any:
    """JSON data with every string made encodable; refused past MAX_DEPTH."""
    if isinstance(value, str):
        return _SURROGATES.sub("\ufffd", value)
    if isinstance(value, list | dict) and depth >= MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, list):
        return [_clean(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {_clean(key): _clean(item, depth + 1) for key, item in value.items()}
    return value


class CellOutput:
    def __init__(self, on_stdout: TextCallback | None, on_stderr: TextCallback | None,
                 on_result: ResultCallback | None) -> None:
        self.execution = Execution()
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._stdout_size = 0
        self._kept = 0  # bytes held for this cell
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._on_result = on_result

    def _room(self, size: int) -> bool:
        if self._kept + size > MAX_CELL_OUTPUT:
            self.execution.truncated = True
            return False
        self._kept += size
        return True

    def apply(self, event: dict[str, Any]) -> bool:
        """Take one event of this cell; True once the cell is over (its idle status)."""
        kind = event["t"]
        if kind == "idle":
            return True
        if kind == "stream":
            self._stream(event)
        elif kind == "result":
            self._result(event)
        elif kind == "count":
            count = event.get("n")
            if isinstance(count, int) and not isinstance(count, bool):
                self.execution.execution_count = count
        elif kind == "error":
            trace = event.get("traceback")
            lines = [_text(line) for line in trace if isinstance(line, str)] \
                if isinstance(trace, list) else []
            self.execution.error = ExecutionError(
                name=_text(event.get("ename"), 1000), value=_text(event.get("evalue"), 64000),
                traceback=_ANSI_RE.sub("", "\n".join(lines))[-_MAX_TRACEBACK:])
        elif kind == "clear":
            self._kept -= self._stdout_size
            self._stdout.clear()
            self._stdout_size = 0
        return False

    def _stream(self, event: dict[str, Any]) -> None:
        name = "stderr" if event.get("name") == "stderr" else "stdout"
        text = _text(event.get("text"))
        if not text or not self._room(len(text)):
            return
        if name == "stdout":
            self._stdout.append(text)
            self._stdout_size += len(text)
        else:
            self._stderr.append(text)
        callback = self._callbacks[name]
        if callback:
            callback(text)

    def _result(self, event: dict[str, Any]) -> None:
        data = event.get("data")
        if not isinstance(data, dict) or not self._room(int(event.get("_bytes") or 0)):
            return
        try:
            result = Result.from_bundle(_clean(data), is_main_result=event.get("main") is True)
        except (ValidationError, TypeError, ValueError):  # _TooDeep is a ValueError
            self.execution.truncated = True  # a bundle no honest kernel sends: dropped
            return
        self.execution.results.append(result)
        if self._on_result:
            self._on_result(result)

    def finish(self, dropped: bool) -> Execution:
        self.execution.stdout = "".join(self._stdout)
        self.execution.stderr = "".join(self._stderr)
        self.execution.truncated = self.execution.truncated or dropped
        return self.execution


class CellStop:
    """When one running cell is interrupted (SIGINT) or its kernel restarted: past its
    deadline, or once its call is cancelled (the client gave up), whatever the sandbox
    sends meanwhile."""

    def __init__(self, timeout: float, call: CallCancel | None) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.call = call
        self.due: float | None = None  # when the cell was to be stopped
        self.interrupted_at: float | None = None  # the first SIGINT
        self._sigint_at = 0.0  # the last one
        # The kernel has the cell (its first event, execute_input, came): an idle kernel
        # ignores SIGINT, so one sent before would be lost and the cell run to its end.
        self.taken = False

    def step(self, now: float) -> Literal["wait", "interrupt", "restart"]:
        if self.due is None and (now > self.deadline or self.cancelled):
            self.due = now
        if self.due is None:
            return "wait"
        if now > (self.interrupted_at or self.due) + INTERRUPT_GRACE:
            return "restart"  # deaf to SIGINT, or never took the cell
        if self.taken and now - self._sigint_at > INTERRUPT_AGAIN:
            # Again while the cell runs on: one SIGINT is at times lost even once the
            # kernel has the cell (about 1 cancel in 20 in test_mcp_cancel, ipykernel
            # 7.4); the kernel ignores SIGINT once the cell is over, so more do no harm.
            self.interrupted_at = self.interrupted_at or now
            self._sigint_at = now
            return "interrupt"
        return "wait"

    @property
    def cancelled(self) -> bool:
        return self.call is not None and self.call.cancelled

    def why(self) -> str:
        if self.cancelled:
            return "the call was cancelled"
        return f"execution timed out after {self.timeout:g} s"

    def restarted(self) -> ExecutionError:
        return ExecutionError(name="TimeoutError", value=f"{self.why()} and the kernel did "
                              "not stop on interrupt; it was restarted: its variables are lost")

    def settle(self, execution: Execution) -> Execution:
        """An interrupted cell's result says so (its own traceback kept)."""
        error = execution.error
        if self.interrupted_at is not None and (error is None or error.name != "TimeoutError"):
            execution.error = ExecutionError(
                name="TimeoutError", value=f"{self.why()} and was interrupted; the context's "
                "variables are kept", traceback=error.traceback if error else "")
        return execution
