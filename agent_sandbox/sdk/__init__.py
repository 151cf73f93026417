"""The public Python API: ``Sandbox`` (sync) and ``AsyncSandbox`` (async), shaped like E2B's."""

from agent_sandbox.core.models import (
    CodeContext,
    CommandResult,
    EntryInfo,
    Execution,
    ExecutionError,
    FilesystemEvent,
    ProcessInfo,
    ProcessOutput,
    Result,
    SandboxInfo,
    TemplateInfo,
    VolumeInfo,
)
from agent_sandbox.core.spec import CreateSpec
from agent_sandbox.sdk.async_sandbox import (
    AsyncSandbox,
    AsyncSecret,
    AsyncVolume,
    AsyncWatchHandle,
)
from agent_sandbox.sdk.commands import CommandHandle
from agent_sandbox.sdk.pty import PtyHandle
from agent_sandbox.sdk.sandbox import Sandbox
from agent_sandbox.sdk.secret import Secret
from agent_sandbox.sdk.twin import max_threads, set_max_threads
from agent_sandbox.sdk.volume import Volume
from agent_sandbox.sdk.watch import WatchHandle

__all__ = [
    "AsyncSandbox",
    "AsyncSecret",
    "AsyncVolume",
    "AsyncWatchHandle",
    "CodeContext",
    "CommandHandle",
    "CommandResult",
    "CreateSpec",
    "EntryInfo",
    "Execution",
    "ExecutionError",
    "FilesystemEvent",
    "ProcessInfo",
    "ProcessOutput",
    "PtyHandle",
    "Result",
    "Sandbox",
    "SandboxInfo",
    "Secret",
    "TemplateInfo",
    "max_threads",
    "set_max_threads",
    "Volume",
    "VolumeInfo",
    "WatchHandle",
]
