"""Code interpreter: Jupyter kernels inside sandboxes, driven from the host.

Each context of a sandbox is one ``ipykernel`` process started inside the sandbox by the
guest (a background exec), listening on ZeroMQ ``ipc`` sockets in the sandbox's run
directory (``/.abx/run`` inside). The host writes the connection file there (by a confined
descriptor, never by path) and never touches the sockets: a bridge process inside the
sandbox (``guest/kernel_bridge.py``, a foreground exec) speaks ZeroMQ to the kernel and
sends the host one checked, bounded line per event (``kernel_channel``, ``kernel_cell``).

What the host knows about a context (its kernel's pid, socket names, HMAC key, cwd) is in
``<sandbox dir>/kernels/<context>.json``, outside the sandbox's reach, so a new engine
process reconnects to a live kernel. Kernels are started lazily, interrupted (SIGINT) on a
timeout, restarted when found dead, and end with their sandbox. A context may run as an
account of the sandbox instead of its root (``kernel_user``).
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_sandbox.core import cancel, code_languages, validate
from agent_sandbox.core.cancel import CallCancel, detached
from agent_sandbox.core.errors import (
    CancelledCallError,
    InvalidArgumentError,
    NotFoundError,
    RuntimeUnavailableError,
    SandboxError,
    WrongStateError,
)
from agent_sandbox.core.inside import GUEST_DIR
from agent_sandbox.core.models import CodeContext, Execution, ExecutionError
from agent_sandbox.core.states import SandboxState
from agent_sandbox.core.templates import CODE_INTERPRETER
from agent_sandbox.guestlink.client import GuestClient, GuestUnavailableError, ProcOutput
from agent_sandbox.guestlink.kernel_cell import CellOutput, CellStop, ResultCallback, TextCallback
from agent_sandbox.guestlink.kernel_channel import CLOSED, KernelChannel
from agent_sandbox.service.code import users as kernel_user
from agent_sandbox.service.code.files import KernelFiles, KernelHost, KernelState
from agent_sandbox.service.code.formatters import kernel_argv

if TYPE_CHECKING:
    from agent_sandbox.core.templates import Template
    from agent_sandbox.service.record import SandboxRecord


CODE_TEMPLATE = CODE_INTERPRETER
_READY_TIMEOUT = 60.0  # a kernel on a small CPU share under load can take a while
_MIN_START = 15.0  # what run_code allows a kernel to start, however short its timeout
_LIVENESS_EVERY = 1.0  # seconds of silence between checks that the kernel still runs
_POLL = 0.2  # seconds between looks at a cell's deadline and its call's cancellation
_KERNEL_LOG = 64 * 1024
_BRIDGE = f"{GUEST_DIR}/kernel_bridge.py"
_TCP_PORTS = (20000, 60000)  # where a TCP kernel's ports start (random: a clash is rare)


def kernel_spec(tmpl: Template, language: str) -> dict[str, Any]:
    """How ``tmpl`` starts a kernel of ``language`` (its ``kernel``: Python's, and the
    other languages it has under ``languages``), or why it cannot."""
    specs = tmpl.kernels()
    if language not in specs:
        raise WrongStateError(
            f"template {tmpl.name!r} has no {language} kernel (it runs "
            f"{', '.join(sorted(specs))}); see docs/engine.md, The code interpreter: a "
            "language's packages could not be had when the template was built")
    return specs[language]


class _KernelGone(Exception):
    """The kernel process is not running (any more)."""


@dataclass
class _Kernel:
    state: KernelState
    channel: KernelChannel
    cells: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def close(self) -> None:
        self.channel.close()


class Kernels:
    """The engine's kernels, per (sandbox, context); one cell at a time per context."""

    def __init__(self, host: KernelHost, files: KernelFiles | None = None) -> None:
        self.host = host
        self.files = files or KernelFiles(host)  # Pods: through the guest
        self._kernels: dict[tuple[str, str], _Kernel] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _kernel_template(self, row: SandboxRecord) -> Template:
        tmpl = self.host.template_for(row)
        if tmpl.kernel is None:
            raise WrongStateError(
                f"sandbox {row.id} runs template {row.template!r}, which has no code "
                f"interpreter kernel; create the sandbox with template={CODE_TEMPLATE!r} "
                "to use run_code (or run python3 through commands)")
        return tmpl

    # public ----------------------------------------------------------------------------
    def run_code(self, sandbox_id: str, code: str, *, language: str | None = None,
                 timeout: float | None = 60, context: str | None = None,
                 on_stdout: TextCallback | None = None, on_stderr: TextCallback | None = None,
                 on_result: ResultCallback | None = None) -> Execution:
        if not isinstance(code, str):
            raise InvalidArgumentError("code must be a string")
        lang = code_languages.code_language(language)
        timeout = validate.positive(timeout, "timeout", maximum=86400) or 60.0
        # No context: the language's default one (Python's is ``default``).
        ctx = (code_languages.default_context(lang) if context is None
               else validate.code_context(context))
        row = self.host.row(sandbox_id)
        tmpl = self._kernel_template(row)
        if context is not None and language is not None:
            state = self.files.load(sandbox_id, ctx)
            known = state.language if state is not None else code_languages.default_language(ctx)
            if known is not None and known != lang:
                raise InvalidArgumentError(
                    f"context {ctx!r} runs {known}, not {lang}: give the context or the "
                    "language, not both")
        if context is None:
            kernel_spec(tmpl, lang)  # a template without it: say so before any start
        call = cancel.current()
        # A cancelled call is stopped by the cell's loop (SIGINT), never by cutting the
        # connections it opens halfway: it still ends its kernel start, and still watches,
        # stops or restarts the kernel of its cell.
        with cancel.held(self._lock((sandbox_id, ctx)), "run_code", _POLL), detached():
            restarted = False
            for attempt in range(2):
                try:
                    # A cell's caller waits for a kernel start about as long as it asked
                    # to wait for the cell (a bridge that never answers pins nobody).
                    ready = min(_READY_TIMEOUT, max(float(timeout), _MIN_START))
                    kernel, fresh = self._ensure(sandbox_id, row, tmpl, ctx, ready)
                    restarted = restarted or fresh
                    execution = self._execute(sandbox_id, kernel, code, float(timeout),
                                              on_stdout, on_stderr, on_result, call)
                except _KernelGone:
                    # Killed before it took the cell (from outside, OOM): once more on a
                    # fresh kernel, and say so.
                    self._drop(sandbox_id, ctx)
                    if attempt:
                        raise RuntimeUnavailableError(
                            f"the kernel of context {ctx!r} died again at once; see "
                            "the sandbox's memory limit") from None
                    restarted = True
                    continue
                execution.context_id = ctx
                execution.kernel_restarted = restarted
                return execution
        raise AssertionError("unreachable")

    def create_context(self, sandbox_id: str, cwd: str | None = None,
                       language: str | None = None, user: str | None = None) -> CodeContext:
        """A new context, its kernel started now (as ``user``, an account of the sandbox,
        if given: see ``kernel_user``)."""
        lang = code_languages.code_language(language)
        user = validate.user(user)
        row = self.host.row(sandbox_id)
        tmpl = self._kernel_template(row)
        kernel_spec(tmpl, lang)
        cwd = validate.path(cwd or tmpl.workdir, "cwd")
        ctx = f"ctx-{secrets.token_hex(4)}"
        state = KernelState(context=ctx, cwd=cwd, key=secrets.token_hex(32), user=user,
                            language=lang)
        self.files.save(sandbox_id, state)
        with self._lock((sandbox_id, ctx)):
            try:
                self._start(sandbox_id, row, tmpl, state)
            except BaseException:
                (self.files.state_dir(sandbox_id) / f"{ctx}.json").unlink(missing_ok=True)
                raise
        return CodeContext(id=ctx, language=lang, cwd=cwd, user=user)

    def warm(self, row: SandboxRecord) -> None:
        """Start the default context's kernel of a sandbox nobody has yet (a pooled one):
        its first cell then finds it running instead of waiting for a kernel start.
        Nothing for a template without a kernel."""
        tmpl = self.host.template_for(row)
        if tmpl.kernel is None:
            return
        ctx = validate.DEFAULT_CONTEXT
        with self._lock((row.id, ctx)):
            # The pool marks a sandbox pooled, so claimable, before it warms it: one a
            # create claimed meanwhile is the claimer's, with its envs and owner (and
            # unwarm had nothing to end); its kernel starts with its first cell.
            try:
                now = self.host.row(row.id).state  # NotFoundError: not visible, pooled
            except NotFoundError:
                now = SandboxState.POOLED
            if now != SandboxState.POOLED:
                return
            if (row.id, ctx) not in self._kernels:
                self._start(row.id, row, tmpl, self._known_state(row.id, ctx, tmpl))

    def unwarm(self, sandbox_id: str) -> None:
        """A pooled sandbox was claimed with envs its warm kernel started without: that
        kernel ends, and the first cell starts one that has them."""
        if self.host.template_for(self.host.row(sandbox_id)).kernel is not None:
            self.remove_context(sandbox_id, validate.DEFAULT_CONTEXT)

    def restart_context(self, sandbox_id: str, context: str | None = None) -> None:
        """A fresh kernel for the context: its variables are gone, its cwd kept."""
        ctx = validate.code_context(context)
        row = self.host.row(sandbox_id)
        tmpl = self._kernel_template(row)
        with self._lock((sandbox_id, ctx)):
            state = self._known_state(sandbox_id, ctx, tmpl)
            self._stop(sandbox_id, ctx, state)
            self._start(sandbox_id, row, tmpl, state)

    def remove_context(self, sandbox_id: str, context: str) -> None:
        """End the context's kernel and forget the context (``default`` comes back, fresh,
        with the next cell that names no context)."""
        ctx = validate.code_context(context)
        row = self.host.row(sandbox_id)
        with self._lock((sandbox_id, ctx)):
            state = self._known_state(sandbox_id, ctx, self._kernel_template(row))
            self.host.guest(sandbox_id, row)  # resumes a paused sandbox: its kernel ends too
            self._stop(sandbox_id, ctx, state)
            (self.files.state_dir(sandbox_id) / f"{ctx}.json").unlink(missing_ok=True)

    def list_contexts(self, sandbox_id: str) -> list[CodeContext]:
        self.host.row(sandbox_id)
        out = []
        for path in sorted(self.files.state_dir(sandbox_id).glob("*.json")):
            state = self.files.load(sandbox_id, path.stem)
            if state is not None:
                out.append(CodeContext(id=state.context, cwd=state.cwd, user=state.user,
                                       language=state.language))
        return out

    def forget(self, sandbox_id: str, *, keep_contexts: bool = True) -> None:
        """The sandbox's container is going away: close the host side of its kernels."""
        with self._guard:
            keys = [k for k in self._kernels if k[0] == sandbox_id]
            kernels = [self._kernels.pop(k) for k in keys]
            if not keep_contexts:
                for key in [k for k in self._locks if k[0] == sandbox_id]:
                    self._locks.pop(key, None)
        for kernel in kernels:
            kernel.close()

    def close(self) -> None:
        with self._guard:
            kernels = list(self._kernels.values())
            self._kernels.clear()
        for kernel in kernels:
            kernel.close()

    # kernels ---------------------------------------------------------------------------
    def _known_state(self, sandbox_id: str, ctx: str, tmpl: Template) -> KernelState:
        state = self.files.load(sandbox_id, ctx)
        if state is not None:
            return state
        language = code_languages.default_language(ctx)
        if language is None:
            raise NotFoundError(f"code context {ctx!r} not found in sandbox {sandbox_id} "
                                "(create one with create_code_context)")
        return KernelState(context=ctx, cwd=tmpl.workdir, key=secrets.token_hex(32),
                           language=language)

    def _drop(self, sandbox_id: str, ctx: str) -> None:
        with self._guard:
            kernel = self._kernels.pop((sandbox_id, ctx), None)
        if kernel is not None:
            kernel.close()

    def _ensure(self, sandbox_id: str, row: SandboxRecord, tmpl: Template,
                ctx: str, ready: float) -> tuple[_Kernel, bool]:
        """The context's kernel: ours, a live one another engine process started, or a new
        one. The flag says a kernel that had run before was replaced (state lost)."""
        self.host.guest(sandbox_id, row)  # resumes a paused sandbox
        kernel = self._kernels.get((sandbox_id, ctx))
        if kernel is not None:
            return kernel, False
        state = self._known_state(sandbox_id, ctx, tmpl)
        had_kernel = state.pid is not None
        if state.pid is not None and state.prefix is not None:
            try:
                if self._running(sandbox_id, state):
                    kernel = self._connect(sandbox_id, state, tmpl, ready_timeout=10.0)
                    with self._guard:
                        self._kernels[(sandbox_id, ctx)] = kernel
                    return kernel, False
            except (_KernelGone, SandboxError, TimeoutError):
                pass  # not answering as it should: replaced below
            self._stop(sandbox_id, ctx, state)
        return self._start(sandbox_id, row, tmpl, state, ready), had_kernel

    def _guest(self, sandbox_id: str) -> GuestClient:
        return self.host.client(sandbox_id)

    def _running(self, sandbox_id: str, state: KernelState) -> bool:
        """Is the context's kernel process alive (the guest's table, pid and argv)?"""
        if state.pid is None:
            return False
        try:
            procs = self._guest(sandbox_id).ps()
        except GuestUnavailableError:
            return False
        return any(p["pid"] == state.pid and p["running"] and state.inside in p["argv"]
                   for p in procs)

    def _stop(self, sandbox_id: str, ctx: str, state: KernelState) -> None:
        self._drop(sandbox_id, ctx)
        if state.pid is not None and self._running(sandbox_id, state):
            with contextlib.suppress(SandboxError):
                self._guest(sandbox_id).kill(state.pid, 9)
        self.files.remove(sandbox_id, state)
        state.pid = None
        state.prefix = None

    def _start(self, sandbox_id: str, row: SandboxRecord, tmpl: Template,
               state: KernelState, ready: float = _READY_TIMEOUT) -> _Kernel:
        assert tmpl.kernel is not None
        self._drop(sandbox_id, state.context)
        guest = self.host.guest(sandbox_id, row)
        self.files.remove(sandbox_id, state)
        state.prefix = f"k{secrets.token_hex(4)}"
        spec = kernel_spec(tmpl, state.language)
        # A TCP kernel's five ports on the sandbox's own loopback (its network namespace).
        state.port = (_TCP_PORTS[0] + secrets.randbelow(_TCP_PORTS[1] - _TCP_PORTS[0])
                      if spec.get("transport") == "tcp" else 0)
        python = tmpl.kernel["argv"][0]
        # An account's ids, by the guest's own checks (its errors are the caller's answer).
        ids = None if state.user is None else kernel_user.account_ids(guest, python,
                                                                      state.user)
        self.files.write_connection(sandbox_id, state)
        argv = kernel_argv([a.replace("{connection_file}", state.inside)
                            for a in spec["argv"]])
        env = self.host.env(row, None)
        env.update(spec.get("env", {}))
        try:
            if ids is not None:
                kernel_user.hand_over(guest, python, state.prefix, ids)
            state.pid = guest.start(argv, cwd=state.cwd, env=env, max_output=_KERNEL_LOG,
                                    user=state.user)
        except SandboxError as exc:
            self.files.remove(sandbox_id, state)
            raise RuntimeUnavailableError(f"could not start the kernel: {exc}") from exc
        state.started_at = time.time()
        self.files.save(sandbox_id, state)
        try:
            kernel = self._connect(sandbox_id, state, tmpl, ready_timeout=ready)
        except BaseException as exc:
            out = self._output(sandbox_id, state.pid)
            detail = out and (out.stdout + out.stderr).decode(errors="replace").strip()[-3000:]
            self._stop(sandbox_id, state.context, state)
            self.files.save(sandbox_id, state)
            if isinstance(exc, _KernelGone | SandboxError | TimeoutError):
                raise RuntimeUnavailableError(
                    f"the kernel of context {state.context!r} did not start: {exc}"
                    + (f"\nkernel output:\n{detail}" if detail else "")) from None
            raise
        with self._guard:
            self._kernels[(sandbox_id, state.context)] = kernel
        return kernel

    def _output(self, sandbox_id: str, pid: int | None) -> ProcOutput | None:
        """What the guest kept of a kernel process (output, exit code), if it can say."""
        if pid is None:
            return None
        try:
            return self._guest(sandbox_id).output(pid)
        except SandboxError:
            return None

    def _connect(self, sandbox_id: str, state: KernelState, tmpl: Template,
                 ready_timeout: float) -> _Kernel:
        """A bridge to the context's kernel, once it says the kernel answers."""
        assert tmpl.kernel is not None
        # The kernel's own interpreter: the one with pyzmq.
        argv = [tmpl.kernel["argv"][0], "-I", _BRIDGE, state.inside, str(ready_timeout)]
        kernel = _Kernel(state, KernelChannel(self._guest(sandbox_id), argv, "/", state.user))
        try:
            self._wait_ready(sandbox_id, kernel, ready_timeout + 5)
        except BaseException:
            kernel.close()
            raise
        return kernel

    def _wait_ready(self, sandbox_id: str, kernel: _Kernel, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_check = time.monotonic()
        while time.monotonic() < deadline:
            event = kernel.channel.next(0.2)
            if event is CLOSED:
                raise _KernelGone("the kernel bridge ended: "
                                  + kernel.channel.stderr.strip()[-1000:])
            if event is not None and event["t"] == "ready":
                return
            if event is not None and event["t"] == "fatal":
                raise _KernelGone(str(event.get("message"))[:1000])
            if time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                if not self._running(sandbox_id, kernel.state):
                    raise _KernelGone("the kernel process exited")
        raise TimeoutError(f"the kernel did not answer within {timeout:.0f} s")

    # running a cell --------------------------------------------------------------------
    def _execute(self, sandbox_id: str, kernel: _Kernel, code: str, timeout: float,
                 on_stdout: TextCallback | None, on_stderr: TextCallback | None,
                 on_result: ResultCallback | None, call: CallCancel | None) -> Execution:
        channel = kernel.channel
        channel.reset()  # whatever an earlier (timed-out) cell still sent
        if call is not None and call.cancelled:
            # Given up before the kernel had it: the cell is never sent (once sent, the
            # kernel would run it even if its interrupt came first).
            raise CancelledCallError("run_code was cancelled before its cell started")
        cell = next(kernel.cells)
        channel.send({"op": "execute", "id": cell, "code": code})
        out = CellOutput(on_stdout, on_stderr, on_result)
        # A cancel wakes the wait for events at once instead of at its next look.
        with call.registered(channel.wake) if call else contextlib.nullcontext():
            return self._follow(sandbox_id, kernel, cell, CellStop(timeout, call), out)

    def _follow(self, sandbox_id: str, kernel: _Kernel, cell: int, stop: CellStop,
                out: CellOutput) -> Execution:
        """The cell's events until it is done; past its deadline, or once its call is
        cancelled, it is interrupted, and its kernel restarted if that does not stop it."""
        channel = kernel.channel
        last_check = time.monotonic()
        while True:
            event = channel.next(_POLL)
            now = time.monotonic()
            if event is not None and event is not CLOSED and event.get("id") == cell:
                stop.taken = True
                if out.apply(event):
                    break
            action = stop.step(now)
            if action == "interrupt":
                self._interrupt(sandbox_id, kernel)
            elif action == "restart":
                self._stop(sandbox_id, kernel.state.context, kernel.state)
                self.files.save(sandbox_id, kernel.state)
                out.execution.error = stop.restarted()
                break
            if event is CLOSED or (event is None and now - last_check > _LIVENESS_EVERY):
                last_check = now
                self.host.touch(sandbox_id)  # a long cell is a use
                if not self._running(sandbox_id, kernel.state):
                    proc = self._output(sandbox_id, kernel.state.pid)
                    code_ = "?" if proc is None or proc.exit_code is None else proc.exit_code
                    if not stop.taken and code_ == 137:
                        # SIGKILLed with nothing published for this cell: dead before it
                        # took it. (A cell that exits, e.g. os._exit, is its error: it dies
                        # before its busy status leaves, so taken can't tell.)
                        raise _KernelGone("the kernel was killed")
                    self._drop(sandbox_id, kernel.state.context)
                    out.execution.error = ExecutionError(
                        name="KernelDiedError",
                        value=f"the kernel died while running this cell (exit code {code_}; "
                              "137 usually means out of memory); the next run_code starts "
                              "a new one: variables are lost")
                    break
                if event is CLOSED:
                    self._drop(sandbox_id, kernel.state.context)
                    out.execution.error = ExecutionError(
                        name="KernelConnectionError",
                        value="the connection to the kernel ended during this cell ("
                              + (channel.stderr.strip()[-500:] or "no detail")
                              + "); its variables are kept: run the cell again")
                    break
        return stop.settle(out.finish(channel.dropped))

    def _interrupt(self, sandbox_id: str, kernel: _Kernel) -> None:
        if kernel.state.pid is None:
            return
        with contextlib.suppress(SandboxError):
            self._guest(sandbox_id).kill(kernel.state.pid, 2)  # SIGINT: KeyboardInterrupt

