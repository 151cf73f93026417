"""Data shapes shared by the providers and the SDK (and, later, the wire layers)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

SandboxState = Literal["running", "paused"]


class SandboxInfo(BaseModel):
    sandbox_id: str
    template: str
    state: str
    created_at: float
    last_used: float
    timeout: float = Field(description="idle seconds before the sandbox is auto-paused")
    persistent: bool
    network: bool
    volume_id: str
    metadata: dict[str, str] = {}
    envs: dict[str, str] = {}
    limits: dict[str, Any] = {}
    # Which limits the host really enforces (e.g. {"memory": True, "disk": True}).
    enforced: dict[str, bool] = {}

    @property
    def expires_at(self) -> float:
        return self.last_used + self.timeout


class CommandResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False
    timed_out: bool = False
    pid: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class ProcessInfo(BaseModel):
    pid: int
    cmd: str
    running: bool
    exit_code: int | None = None
    started_at: float = 0.0


class ProcessOutput(BaseModel):
    pid: int
    stdout: str
    stderr: str
    running: bool
    exit_code: int | None = None
    truncated: bool = False


class EntryInfo(BaseModel):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    symlink_target: str | None = None


class TemplateInfo(BaseModel):
    name: str
    kind: str
    description: str = ""
    env: dict[str, str] = {}
    workdir: str = "/workspace"
    commands: dict[str, dict[str, str]] = {}
    has_kernel: bool = False
    created_at: float = 0.0


class VolumeInfo(BaseModel):
    volume_id: str
    size_mb: int
    created_at: float
    attached_to: str = ""
