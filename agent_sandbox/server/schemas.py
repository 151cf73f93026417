"""Request bodies. Types are kept loose on purpose (``int | float`` for sizes, plain
``str`` for paths): the engine's validation is the one source of truth, so a bad value
gets the same message remotely as locally."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSandbox(_Body):
    template: str = "base"
    timeout: float = Field(300, description="idle seconds before auto-pause")
    envs: dict[str, str] | None = None
    cpu: float | None = None
    memory_mb: int | float | None = None
    disk_mb: int | float | None = None
    network: bool = False
    persistent: bool = False
    metadata: dict[str, str] | None = None
    volume: str | None = None


class SetTimeout(_Body):
    timeout: float


class RunCommand(_Body):
    cmd: str
    cwd: str | None = None
    envs: dict[str, str] | None = None
    timeout: float | None = None
    stdin: str | None = None
    stdin_base64: str | None = Field(None, description="binary stdin, base64")
    stream: bool = Field(False, description="answer NDJSON events instead of one result")


class StartProcess(_Body):
    cmd: str
    cwd: str | None = None
    envs: dict[str, str] | None = None


class Started(BaseModel):
    pid: int


class WaitProcess(_Body):
    timeout: float | None = None
    stream: bool = False


class KillProcess(_Body):
    signal: int = 9


class Killed(BaseModel):
    killed: bool


class SendStdin(_Body):
    data: str | None = None
    data_base64: str | None = None
    close: bool = False


class CustomCommand(_Body):
    args: list[str] | None = None


class RunCode(_Body):
    code: str
    language: str = "python"
    timeout: int | float | None = Field(60, description="seconds; past it the cell is interrupted "
                                                  "and the context's variables are kept")
    context: str | None = Field(None, description="code context id (default: `default`)")
    stream: bool = Field(False, description="answer NDJSON events instead of one result")


class CreateCodeContext(_Body):
    cwd: str | None = Field(None, description="working directory (default: the template's)")
    language: str = "python"


class PathBody(_Body):
    path: str


class RenameBody(_Body):
    src: str
    dst: str


class Written(BaseModel):
    size: int


class Exists(BaseModel):
    exists: bool


class Health(BaseModel):
    status: str
    sandboxes: int


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict = {}
