"""The public Python API: ``Sandbox`` (sync) and ``AsyncSandbox`` (async), shaped like E2B's."""

from agent_sandbox.models import (
    CodeContext,
    CommandResult,
    CreateOptions,
    EntryInfo,
    Execution,
    ExecutionError,
    ProcessInfo,
    ProcessOutput,
    Result,
    SandboxInfo,
    TemplateInfo,
)
from agent_sandbox.sdk.async_sandbox import AsyncSandbox
from agent_sandbox.sdk.commands import CommandHandle
from agent_sandbox.sdk.pty import PtyHandle
from agent_sandbox.sdk.sandbox import Sandbox
from agent_sandbox.sdk.twin import max_threads, set_max_threads

__all__ = [
    "AsyncSandbox",
    "CodeContext",
    "CommandHandle",
    "CommandResult",
    "CreateOptions",
    "EntryInfo",
    "Execution",
    "ExecutionError",
    "ProcessInfo",
    "ProcessOutput",
    "PtyHandle",
    "Result",
    "Sandbox",
    "SandboxInfo",
    "TemplateInfo",
    "max_threads",
    "set_max_threads",
]
