"""Code interpreter: Jupyter kernels inside sandboxes, driven from the host.

Each context of a sandbox is one ``ipykernel`` process started inside the sandbox by the
guest (a background exec), listening on ZeroMQ ``ipc`` sockets in the sandbox's run
directory (``/.abx/run`` inside, ``<sandbox dir>/run`` on the host). The host writes the
connection file there and talks to the kernel with ``jupyter_client`` over the same socket
files: no network, and it works across the sandbox's network namespace.

What the host knows about a context (its kernel's pid, socket names, HMAC key, cwd) is in
``<sandbox dir>/kernels/<context>.json``, outside the sandbox's reach, so a new engine
process reconnects to a live kernel. Kernels are started lazily, interrupted (SIGINT) on a
timeout, restarted when found dead, and end with their sandbox.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
from jupyter_client.blocking.client import BlockingKernelClient

from agent_sandbox.errors import (
    InvalidArgumentError,
    NotFoundError,
    RuntimeUnavailableError,
    SandboxError,
    WrongStateError,
)
from agent_sandbox.models import CodeContext, Execution, ExecutionError, Result
from agent_sandbox.runtime import validate
from agent_sandbox.runtime.config import HOST_ID_BASE
from agent_sandbox.runtime.guest_client import GuestClient, GuestUnavailableError
from agent_sandbox.runtime.oci import GUEST_RUN_DIR

if TYPE_CHECKING:
    from agent_sandbox.runtime.engine import Engine
    from agent_sandbox.runtime.store import SandboxRow
    from agent_sandbox.runtime.templates import Template

CODE_TEMPLATE = "code-interpreter-v1"
_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
_READY_TIMEOUT = 60.0  # a kernel on a small CPU share under load can take a while
_LIVENESS_EVERY = 1.0  # seconds of silence between checks that the kernel still runs
_INTERRUPT_GRACE = 5.0  # after SIGINT, how long a cell has to stop before a restart
_KERNEL_LOG = 64 * 1024
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

TextCallback = Callable[[str], None]
ResultCallback = Callable[[Result], None]


class _KernelGone(Exception):
    """The kernel process is not running (any more)."""


@dataclass
class _State:
    """What the host keeps about one context (``<sandbox dir>/kernels/<ctx>.json``)."""

    context: str
    cwd: str
    key: str
    pid: int | None = None
    prefix: str | None = None  # the kernel's socket files are run/<prefix>-<port>
    started_at: float = 0.0


@dataclass
class _Kernel:
    state: _State
    client: BlockingKernelClient

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.stop_channels()


def _strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


class Kernels:
    """The engine's kernels, per (sandbox, context); one cell at a time per context."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._kernels: dict[tuple[str, str], _Kernel] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    # paths and state -------------------------------------------------------------------
    def _state_dir(self, sandbox_id: str) -> Path:
        return self.engine._dir(sandbox_id) / "kernels"  # noqa: SLF001

    def _run_dir(self, sandbox_id: str) -> Path:
        return self.engine._dir(sandbox_id) / "run"  # noqa: SLF001

    def _load(self, sandbox_id: str, context: str) -> _State | None:
        path = self._state_dir(sandbox_id) / f"{context}.json"
        try:
            return _State(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _save(self, sandbox_id: str, state: _State) -> None:
        folder = self._state_dir(sandbox_id)
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = folder / f".{state.context}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(state), fh)
        os.replace(tmp, folder / f"{state.context}.json")

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _kernel_template(self, row: SandboxRow) -> Template:
        tmpl = self.engine._template_for(row)  # noqa: SLF001
        if tmpl.kernel is None:
            raise WrongStateError(
                f"sandbox {row.id} runs template {row.template!r}, which has no code "
                f"interpreter kernel; create the sandbox with template={CODE_TEMPLATE!r} "
                "to use run_code (or run python3 through commands)")
        return tmpl

    # public ----------------------------------------------------------------------------
    def run_code(self, sandbox_id: str, code: str, *, language: str = "python",
                 timeout: float | None = 60, context: str | None = None,
                 on_stdout: TextCallback | None = None, on_stderr: TextCallback | None = None,
                 on_result: ResultCallback | None = None) -> Execution:
        if not isinstance(code, str):
            raise InvalidArgumentError("code must be a string")
        _check_language(language)
        timeout = validate.positive(timeout, "timeout", maximum=86400) or 60.0
        ctx = validate.code_context(context)
        row = self.engine._row(sandbox_id)  # noqa: SLF001
        tmpl = self._kernel_template(row)
        with self._lock((sandbox_id, ctx)):
            restarted = False
            for attempt in range(2):
                try:
                    kernel, fresh = self._ensure(sandbox_id, row, tmpl, ctx)
                    restarted = restarted or fresh
                    execution = self._execute(sandbox_id, kernel, code, float(timeout),
                                              on_stdout, on_stderr, on_result)
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
                       language: str = "python") -> CodeContext:
        _check_language(language)
        row = self.engine._row(sandbox_id)  # noqa: SLF001
        tmpl = self._kernel_template(row)
        cwd = validate.path(cwd or tmpl.workdir, "cwd")
        ctx = f"ctx-{secrets.token_hex(4)}"
        state = _State(context=ctx, cwd=cwd, key=secrets.token_hex(32))
        self._save(sandbox_id, state)
        with self._lock((sandbox_id, ctx)):
            try:
                self._start(sandbox_id, row, tmpl, state)
            except BaseException:
                (self._state_dir(sandbox_id) / f"{ctx}.json").unlink(missing_ok=True)
                raise
        return CodeContext(id=ctx, language="python", cwd=cwd)

    def restart_context(self, sandbox_id: str, context: str | None = None) -> None:
        """A fresh kernel for the context: its variables are gone, its cwd kept."""
        ctx = validate.code_context(context)
        row = self.engine._row(sandbox_id)  # noqa: SLF001
        tmpl = self._kernel_template(row)
        with self._lock((sandbox_id, ctx)):
            state = self._known_state(sandbox_id, ctx, tmpl)
            self._stop(sandbox_id, ctx, state)
            self._start(sandbox_id, row, tmpl, state)

    def list_contexts(self, sandbox_id: str) -> list[CodeContext]:
        self.engine._row(sandbox_id)  # noqa: SLF001
        out = []
        for path in sorted(self._state_dir(sandbox_id).glob("*.json")):
            state = self._load(sandbox_id, path.stem)
            if state is not None:
                out.append(CodeContext(id=state.context, cwd=state.cwd))
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
    def _known_state(self, sandbox_id: str, ctx: str, tmpl: Template) -> _State:
        state = self._load(sandbox_id, ctx)
        if state is not None:
            return state
        if ctx != validate.DEFAULT_CONTEXT:
            raise NotFoundError(f"code context {ctx!r} not found in sandbox {sandbox_id} "
                                "(create one with create_code_context)")
        return _State(context=ctx, cwd=tmpl.workdir, key=secrets.token_hex(32))

    def _drop(self, sandbox_id: str, ctx: str) -> None:
        with self._guard:
            kernel = self._kernels.pop((sandbox_id, ctx), None)
        if kernel is not None:
            kernel.close()

    def _ensure(self, sandbox_id: str, row: SandboxRow, tmpl: Template,
                ctx: str) -> tuple[_Kernel, bool]:
        """The context's kernel: ours, a live one another engine process started, or a new
        one. The flag says a kernel that had run before was replaced (state lost)."""
        self.engine._guest(sandbox_id, row)  # noqa: SLF001 - resumes a paused sandbox
        kernel = self._kernels.get((sandbox_id, ctx))
        if kernel is not None:
            return kernel, False
        state = self._known_state(sandbox_id, ctx, tmpl)
        had_kernel = state.pid is not None
        if state.pid is not None and state.prefix is not None:
            try:
                if self._running(sandbox_id, state):
                    kernel = self._connect(sandbox_id, state, ready_timeout=10.0)
                    with self._guard:
                        self._kernels[(sandbox_id, ctx)] = kernel
                    return kernel, False
            except (_KernelGone, SandboxError):
                pass
            self._stop(sandbox_id, ctx, state)
        return self._start(sandbox_id, row, tmpl, state), had_kernel

    def _guest(self, sandbox_id: str) -> GuestClient:
        return GuestClient(self.engine._socket(sandbox_id))  # noqa: SLF001

    def _running(self, sandbox_id: str, state: _State) -> bool:
        """Is the context's kernel process alive (the guest's table, pid and argv)?"""
        if state.pid is None:
            return False
        try:
            procs = self._guest(sandbox_id).ps()
        except GuestUnavailableError:
            return False
        marker = f"{GUEST_RUN_DIR}/{state.prefix}.json"
        return any(p["pid"] == state.pid and p["running"] and marker in p["argv"]
                   for p in procs)

    def _stop(self, sandbox_id: str, ctx: str, state: _State) -> None:
        self._drop(sandbox_id, ctx)
        if state.pid is not None and self._running(sandbox_id, state):
            with contextlib.suppress(SandboxError):
                self._guest(sandbox_id).kill(state.pid, 9)
        self._remove_files(sandbox_id, state)
        state.pid = None
        state.prefix = None

    def _remove_files(self, sandbox_id: str, state: _State) -> None:
        if not state.prefix:
            return
        run = self._run_dir(sandbox_id)
        for name in [f"{state.prefix}.json"] + [f"{state.prefix}-{p}" for p in _PORTS.values()]:
            with contextlib.suppress(OSError):
                (run / name).unlink()

    def _connection(self, state: _State, ip: str) -> dict[str, Any]:
        return {"transport": "ipc", "ip": ip, "key": state.key,
                "signature_scheme": "hmac-sha256", "kernel_name": "python3", **_PORTS}

    def _start(self, sandbox_id: str, row: SandboxRow, tmpl: Template,
               state: _State) -> _Kernel:
        assert tmpl.kernel is not None
        self._drop(sandbox_id, state.context)
        guest = self.engine._guest(sandbox_id, row)  # noqa: SLF001
        run = self._run_dir(sandbox_id)
        self._remove_files(sandbox_id, state)
        state.prefix = f"k{secrets.token_hex(4)}"
        conn_file = run / f"{state.prefix}.json"
        fd = os.open(conn_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        # The kernel (the sandbox's root) may rewrite it: owned by that user. fchown, never
        # by path: the sandbox controls this directory and could swap in a link. Rootless,
        # the sandbox's root is this user already.
        if not self.engine.rootless:
            os.fchown(fd, HOST_ID_BASE, HOST_ID_BASE)
        with os.fdopen(fd, "w") as fh:
            json.dump(self._connection(state, f"{GUEST_RUN_DIR}/{state.prefix}"), fh)
        inside = f"{GUEST_RUN_DIR}/{state.prefix}.json"
        argv = [a.replace("{connection_file}", inside) for a in tmpl.kernel["argv"]]
        env = self.engine._env(row, None)  # noqa: SLF001
        env.update(tmpl.kernel.get("env", {}))
        try:
            state.pid = guest.start(argv, cwd=state.cwd, env=env, max_output=_KERNEL_LOG)
        except SandboxError as exc:
            self._remove_files(sandbox_id, state)
            raise RuntimeUnavailableError(f"could not start the kernel: {exc}") from exc
        state.started_at = time.time()
        self._save(sandbox_id, state)
        try:
            self._wait_sockets(sandbox_id, state)
            kernel = self._connect(sandbox_id, state, ready_timeout=_READY_TIMEOUT)
        except BaseException as exc:
            detail = self._kernel_log(sandbox_id, state.pid)
            self._stop(sandbox_id, state.context, state)
            self._save(sandbox_id, state)
            if isinstance(exc, _KernelGone | SandboxError | TimeoutError):
                raise RuntimeUnavailableError(
                    f"the kernel of context {state.context!r} did not start: {exc}"
                    + (f"\nkernel output:\n{detail}" if detail else "")) from None
            raise
        with self._guard:
            self._kernels[(sandbox_id, state.context)] = kernel
        return kernel

    def _kernel_log(self, sandbox_id: str, pid: int | None) -> str:
        if pid is None:
            return ""
        try:
            out = self._guest(sandbox_id).output(pid)
        except SandboxError:
            return ""
        return (out.stdout + out.stderr).decode(errors="replace").strip()[-3000:]

    def _wait_sockets(self, sandbox_id: str, state: _State) -> None:
        """Wait until the kernel has bound its sockets (checking they are sockets, not
        links the sandbox planted: the host must not connect anywhere else)."""
        run = self._run_dir(sandbox_id)
        paths = [run / f"{state.prefix}-{p}" for p in _PORTS.values()]
        deadline = time.monotonic() + _READY_TIMEOUT
        last_check = time.monotonic()
        while True:
            found = 0
            for path in paths:
                try:
                    mode = os.lstat(path).st_mode
                except FileNotFoundError:
                    break
                if not stat.S_ISSOCK(mode):
                    raise _KernelGone(f"{path.name} is not a socket")
                found += 1
            if found == len(paths):
                return
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"no kernel sockets after {_READY_TIMEOUT:.0f} s")
            if now - last_check > 0.5:
                last_check = now
                if not self._running(sandbox_id, state):
                    raise _KernelGone("the kernel process exited")
            time.sleep(0.005)

    def _connect(self, sandbox_id: str, state: _State, ready_timeout: float) -> _Kernel:
        host_ip = str(self._run_dir(sandbox_id) / str(state.prefix))
        for port in _PORTS.values():
            if not stat.S_ISSOCK(os.lstat(f"{host_ip}-{port}").st_mode):
                raise _KernelGone("kernel socket replaced")
        client = BlockingKernelClient()
        client.load_connection_info(self._connection(state, host_ip))
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        kernel = _Kernel(state, client)
        try:
            self._wait_ready(sandbox_id, kernel, ready_timeout)
        except BaseException:
            kernel.close()
            raise
        return kernel

    def _wait_ready(self, sandbox_id: str, kernel: _Kernel, timeout: float) -> None:
        """kernel_info until its busy/idle status arrives on iopub: the shell answers and
        our iopub subscription is live (ZeroMQ drops what is published before it is)."""
        client = kernel.client
        deadline = time.monotonic() + timeout
        last_check = time.monotonic()
        while time.monotonic() < deadline:
            msg_id = client.kernel_info()
            until = time.monotonic() + 0.25
            while time.monotonic() < until:
                msg = _recv(client.iopub_channel.socket, client, 0.05)
                if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                    _drain(client.shell_channel.socket, client)
                    _drain(client.iopub_channel.socket, client)
                    return
            if time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                if not self._running(sandbox_id, kernel.state):
                    raise _KernelGone("the kernel process exited")
        raise TimeoutError(f"the kernel did not answer within {timeout:.0f} s")

    # running a cell --------------------------------------------------------------------
    def _execute(self, sandbox_id: str, kernel: _Kernel, code: str, timeout: float,
                 on_stdout: TextCallback | None, on_stderr: TextCallback | None,
                 on_result: ResultCallback | None) -> Execution:
        client = kernel.client
        _drain(client.shell_channel.socket, client)  # replies of earlier cells
        msg_id = client.execute(code, store_history=True, allow_stdin=False,
                                stop_on_error=True)
        execution = Execution()
        stdout: list[str] = []
        stderr: list[str] = []
        started = time.monotonic()
        deadline = started + timeout
        last_check = started
        interrupted_at: float | None = None
        got_any = False
        sock = client.iopub_channel.socket
        while True:
            msg = _recv(sock, client, 0.2)
            now = time.monotonic()
            if msg is None or msg["parent_header"].get("msg_id") != msg_id:
                if interrupted_at is None and now > deadline:
                    interrupted_at = now
                    self._interrupt(sandbox_id, kernel)
                elif interrupted_at is not None and now > interrupted_at + _INTERRUPT_GRACE:
                    self._stop(sandbox_id, kernel.state.context, kernel.state)
                    self._save(sandbox_id, kernel.state)
                    execution.error = ExecutionError(
                        name="TimeoutError",
                        value=f"execution timed out after {timeout:g} s and the kernel did not "
                              "stop on interrupt; it was restarted: its variables are lost")
                    break
                if msg is None and now - last_check > _LIVENESS_EVERY:
                    last_check = now
                    self.engine.store.touch(sandbox_id)  # a long cell is a use
                    if not self._running(sandbox_id, kernel.state):
                        code_ = self._exit_code(sandbox_id, kernel.state.pid)
                        if not got_any and code_ == 137:
                            # SIGKILLed with nothing published for this cell: dead before
                            # it took it. (A cell that exits, e.g. os._exit, is its error:
                            # it dies before its busy status leaves, so got_any can't tell.)
                            raise _KernelGone("the kernel was killed")
                        self._drop(sandbox_id, kernel.state.context)
                        execution.error = ExecutionError(
                            name="KernelDiedError",
                            value=f"the kernel died while running this cell (exit code "
                                  f"{code_}; 137 usually means out of memory); the next "
                                  "run_code starts a new one: variables are lost")
                        break
                continue
            got_any = True
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "status":
                if content.get("execution_state") == "idle":
                    break
            elif kind == "stream":
                text = content.get("text", "")
                if content.get("name") == "stderr":
                    stderr.append(text)
                    if on_stderr:
                        on_stderr(text)
                else:
                    stdout.append(text)
                    if on_stdout:
                        on_stdout(text)
            elif kind in ("execute_result", "display_data"):
                result = Result.from_bundle(content.get("data", {}),
                                            is_main_result=kind == "execute_result")
                execution.results.append(result)
                if on_result:
                    on_result(result)
            elif kind == "execute_input":
                execution.execution_count = content.get("execution_count")
            elif kind == "error":
                execution.error = ExecutionError(
                    name=content.get("ename", ""), value=content.get("evalue", ""),
                    traceback=_strip_ansi("\n".join(content.get("traceback", []))))
            elif kind == "clear_output":
                stdout.clear()
        if interrupted_at is not None and (execution.error is None
                                           or execution.error.name != "TimeoutError"):
            trace = execution.error.traceback if execution.error else ""
            execution.error = ExecutionError(
                name="TimeoutError",
                value=f"execution timed out after {timeout:g} s and was interrupted; the "
                      "context's variables are kept", traceback=trace)
        execution.stdout = "".join(stdout)
        execution.stderr = "".join(stderr)
        return execution

    def _interrupt(self, sandbox_id: str, kernel: _Kernel) -> None:
        if kernel.state.pid is None:
            return
        with contextlib.suppress(SandboxError):
            self._guest(sandbox_id).kill(kernel.state.pid, 2)  # SIGINT: KeyboardInterrupt

    def _exit_code(self, sandbox_id: str, pid: int | None) -> int | str:
        if pid is None:
            return "?"
        try:
            code = self._guest(sandbox_id).output(pid).exit_code
        except SandboxError:
            return "?"
        return "?" if code is None else code


def _recv(sock: zmq.Socket[Any], client: BlockingKernelClient,
          timeout: float) -> dict[str, Any] | None:
    if not sock.poll(int(timeout * 1000)):
        return None
    _, msg = client.session.recv(sock, mode=zmq.NOBLOCK)
    return msg


def _drain(sock: zmq.Socket[Any], client: BlockingKernelClient) -> None:
    while sock.poll(0):
        client.session.recv(sock, mode=zmq.NOBLOCK)


def _check_language(language: str) -> None:
    if language not in ("python", "python3"):
        raise InvalidArgumentError(f"language {language!r} is not supported; the code "
                                   "interpreter runs python")


