"""``AsyncSandbox``: the same API as ``Sandbox`` for asyncio code.

Provider calls are blocking I/O on a socket; each runs in a worker thread so the event
loop never stalls. Output callbacks may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterable
from functools import partial
from typing import IO, Any, TypeVar

from agent_sandbox.models import (
    CodeContext,
    CommandResult,
    EntryInfo,
    Execution,
    ProcessInfo,
    ProcessOutput,
    Result,
    SandboxInfo,
)
from agent_sandbox.providers import Provider, default_provider
from agent_sandbox.sdk.files import DEFAULT_READ_MAX, Files
from agent_sandbox.sdk.sandbox import code_provider

T = TypeVar("T")
AsyncCallback = Callable[[str], Any]


async def _call(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    return await asyncio.to_thread(partial(fn, *args, **kw))


def _bridge(cb: AsyncCallback | None) -> Callable[[str], None] | None:
    """Make a (possibly async) callback callable from the worker thread."""
    if cb is None:
        return None
    loop = asyncio.get_running_loop()

    def call(text: str) -> None:
        result = cb(text)
        if inspect.isawaitable(result):
            asyncio.run_coroutine_threadsafe(_await(result), loop).result()

    return call


def _bridge_result(cb: Callable[[Result], Any] | None) -> Callable[[Result], None] | None:
    if cb is None:
        return None
    loop = asyncio.get_running_loop()

    def call(result: Result) -> None:
        out = cb(result)
        if inspect.isawaitable(out):
            asyncio.run_coroutine_threadsafe(_await(out), loop).result()

    return call


async def _await(awaitable: Any) -> None:
    await awaitable


class AsyncCommandHandle:
    def __init__(self, provider: Provider, sandbox_id: str, pid: int) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id
        self.pid = pid

    async def wait(self, timeout: float | None = None, on_stdout: AsyncCallback | None = None,
                   on_stderr: AsyncCallback | None = None) -> CommandResult:
        return await _call(self._provider.wait, self._sandbox_id, self.pid, timeout=timeout,
                           on_stdout=_bridge(on_stdout), on_stderr=_bridge(on_stderr))

    async def output(self) -> ProcessOutput:
        return await _call(self._provider.process_output, self._sandbox_id, self.pid)

    async def kill(self) -> bool:
        return await _call(self._provider.kill_process, self._sandbox_id, self.pid)

    async def send_stdin(self, data: str | bytes, close: bool = False) -> None:
        await _call(self._provider.send_stdin, self._sandbox_id, self.pid, data, close=close)


class AsyncCommands:
    def __init__(self, provider: Provider, sandbox_id: str) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id

    async def run(self, cmd: str, cwd: str | None = None, envs: dict[str, str] | None = None,
                  timeout: float = 60, background: bool = False,
                  on_stdout: AsyncCallback | None = None,
                  on_stderr: AsyncCallback | None = None,
                  stdin: str | bytes | None = None) -> CommandResult | AsyncCommandHandle:
        if background:
            pid = await _call(self._provider.start, self._sandbox_id, cmd, cwd=cwd, envs=envs)
            if stdin is not None:
                await _call(self._provider.send_stdin, self._sandbox_id, pid, stdin)
            handle = AsyncCommandHandle(self._provider, self._sandbox_id, pid)
            if on_stdout or on_stderr:
                asyncio.get_running_loop().create_task(
                    handle.wait(on_stdout=on_stdout, on_stderr=on_stderr))
            return handle
        return await _call(self._provider.run, self._sandbox_id, cmd, cwd=cwd, envs=envs,
                           timeout=timeout, stdin=stdin, on_stdout=_bridge(on_stdout),
                           on_stderr=_bridge(on_stderr))

    async def list(self) -> list[ProcessInfo]:
        return await _call(self._provider.processes, self._sandbox_id)

    async def kill(self, pid: int) -> bool:
        return await _call(self._provider.kill_process, self._sandbox_id, pid)


class AsyncFiles:
    def __init__(self, provider: Provider, sandbox_id: str) -> None:
        self._sync = Files(provider, sandbox_id)

    async def read(self, path: str, format: str = "text",
                   max_bytes: int = DEFAULT_READ_MAX) -> Any:
        if format == "stream":
            return self._stream(path)
        return await _call(self._sync.read, path, format, max_bytes)  # type: ignore[arg-type]

    async def _stream(self, path: str) -> AsyncIterator[bytes]:
        chunks = iter(await _call(self._sync.read, path, "stream"))
        sentinel = object()
        while (chunk := await _call(next, chunks, sentinel)) is not sentinel:
            yield chunk  # type: ignore[misc]

    async def write(self, path: str, data: str | bytes | Iterable[bytes] | IO[bytes],
                    mode: int = 0o644) -> int:
        return await _call(self._sync.write, path, data, mode)

    async def list(self, path: str = "/workspace", depth: int = 1) -> list[EntryInfo]:
        return await _call(self._sync.list, path, depth)

    async def exists(self, path: str) -> bool:
        return await _call(self._sync.exists, path)

    async def stat(self, path: str) -> EntryInfo:
        return await _call(self._sync.stat, path)

    async def make_dir(self, path: str) -> None:
        await _call(self._sync.make_dir, path)

    async def remove(self, path: str) -> None:
        await _call(self._sync.remove, path)

    async def rename(self, src: str, dst: str) -> None:
        await _call(self._sync.rename, src, dst)


class AsyncSandbox:
    def __init__(self, info: SandboxInfo, provider: Provider) -> None:
        self._info = info
        self._provider = provider
        self.commands = AsyncCommands(provider, info.sandbox_id)
        self.files = AsyncFiles(provider, info.sandbox_id)

    @classmethod
    async def create(cls, template: str = "base", timeout: float = 300,
                     envs: dict[str, str] | None = None, cpu: float | None = None,
                     memory_mb: int | None = None, disk_mb: int | None = None,
                     network: bool = False, persistent: bool = False,
                     metadata: dict[str, str] | None = None, volume: str | None = None,
                     provider: Provider | None = None) -> AsyncSandbox:
        provider = provider or await _call(default_provider)
        info = await _call(provider.create, template=template, timeout=timeout, envs=envs,
                           cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, network=network,
                           persistent=persistent, metadata=metadata, volume=volume)
        return cls(info, provider)

    @classmethod
    async def connect(cls, sandbox_id: str, provider: Provider | None = None) -> AsyncSandbox:
        provider = provider or await _call(default_provider)
        return cls(await _call(provider.info, sandbox_id), provider)

    @classmethod
    async def list(cls, template: str | None = None, state: str | None = None,
                   provider: Provider | None = None) -> list[SandboxInfo]:
        provider = provider or await _call(default_provider)
        return await _call(provider.list, template=template, state=state)

    @property
    def sandbox_id(self) -> str:
        return self._info.sandbox_id

    @property
    def template(self) -> str:
        return self._info.template

    @property
    def state(self) -> str:
        """State as of the last call; ``await info()`` to refresh."""
        return self._info.state

    async def info(self) -> SandboxInfo:
        self._info = await _call(self._provider.info, self.sandbox_id)
        return self._info

    async def pause(self) -> None:
        self._info = await _call(self._provider.pause, self.sandbox_id)

    async def resume(self) -> None:
        self._info = await _call(self._provider.resume, self.sandbox_id)

    async def reset_rootfs(self) -> None:
        self._info = await _call(self._provider.reset_rootfs, self.sandbox_id)

    async def set_timeout(self, timeout: float) -> None:
        await _call(self._provider.set_timeout, self.sandbox_id, timeout)

    async def kill(self, delete_volume: bool = False) -> None:
        await _call(self._provider.kill, self.sandbox_id, delete_volume=delete_volume)

    async def run_code(self, code: str, language: str = "python", timeout: float | None = 60,
                       context: CodeContext | str | None = None,
                       on_stdout: AsyncCallback | None = None,
                       on_stderr: AsyncCallback | None = None,
                       on_result: Callable[[Result], Any] | None = None) -> Execution:
        """``Sandbox.run_code`` for asyncio; callbacks may be coroutine functions."""
        return await _call(code_provider(self._provider).run_code, self.sandbox_id, code,
                           language=language, timeout=timeout, context=context,
                           on_stdout=_bridge(on_stdout), on_stderr=_bridge(on_stderr),
                           on_result=_bridge_result(on_result))

    async def create_code_context(self, cwd: str | None = None,
                                  language: str = "python") -> CodeContext:
        return await _call(code_provider(self._provider).create_code_context,
                           self.sandbox_id, cwd=cwd, language=language)

    async def restart_code_context(self, context: CodeContext | str | None = None) -> None:
        await _call(code_provider(self._provider).restart_code_context, self.sandbox_id,
                    context)

    async def list_code_contexts(self) -> list[CodeContext]:
        provider: Any = code_provider(self._provider)
        return await _call(provider.list_code_contexts, self.sandbox_id)

    async def custom(self, name: str, args: list[str] | None = None) -> CommandResult:
        return await _call(self._provider.custom, self.sandbox_id, name, args)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill(delete_volume=True)
