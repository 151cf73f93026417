"""Request and response bodies, and what every input of the gateway may be.

The engine's validation (``agent_sandbox.runtime.validate``, the engine's and the guest's
own checks) is the source of truth. A constrained input is checked when the request is
parsed by the engine's own function, so a bad value gets the same message remotely as
locally and a streamed call fails with a status, not an event; its JSON Schema keywords
say the same thing, so /openapi.json describes exactly what is accepted. JSON types are
strict: no ``"1"`` for 1, no ``1`` for true. Bounds the engine and the guest keep as
literals are named here; tests/server/test_schema_bounds.py checks the engine agrees at
each of them.
"""

from __future__ import annotations

import base64
import os
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)

from agent_sandbox import netpolicy
from agent_sandbox.errors import InvalidArgumentError
from agent_sandbox.runtime import validate
from agent_sandbox.runtime.store import SandboxState
from agent_sandbox.runtime.templates import _NAME_RE as _TEMPLATE_NAME
from agent_sandbox.runtime.templates import validate_name

# Bounds the engine (engine.py, kernels.py) and the guest agent keep as literals.
MAX_COMMAND_TIMEOUT = 86400  # run, wait and run_code: at most a day
MAX_SANDBOX_TIMEOUT = 30 * 86400  # create and set_timeout: idle seconds, 30 days
MIN_MEMORY_MB, MAX_MEMORY_MB = 32, 1 << 20
MIN_DISK_MB, MAX_DISK_MB = 16, 1 << 22
MAX_CPU = os.cpu_count() or 1  # the engine's bound: this host's CPUs
# The gateway's own bound: the engine takes any cpu > 0, but the kernel refuses a CPU
# quota under 1 ms per 100 ms period, and the sandbox would not start (a 503).
MIN_CPU = 0.01
# Paths: validate.path takes up to 4096 characters and leaves the rest to the kernel (a
# 400 naming the path). The gateway states the kernel's limits too, in characters as JSON
# Schema counts them: PATH_MAX less its NUL, NAME_MAX a name (a 255-character name longer
# than 255 bytes in UTF-8 is still the kernel's to refuse).
MAX_PATH = 4095
MAX_NAME = 255
MAX_DEPTH = 64  # list_files
MAX_MODE = 0o7777  # permission bits of an upload
MAX_PID = 1 << 22  # the guest's bound, the kernel's PID_MAX_LIMIT
MAX_FILE_OFFSET = 1 << 62  # the guest's bound on a read's offset and limit
MIN_SIGNAL, MAX_SIGNAL = 1, 64  # the guest's bound
LANGUAGES = ("python", "python3")  # kernels.py: the code interpreter runs python
SANDBOX_STATES = (SandboxState.RUNNING, SandboxState.PAUSED)
MAX_NETWORK_ENTRIES = 256  # netpolicy's bound on allow_out and deny_out
MAX_NETWORK_ENTRY = 253  # a host name's longest spelling (a CIDR is shorter)
MAX_NETWORK_TEXT = MAX_NETWORK_ENTRIES * (MAX_NETWORK_ENTRY + 2)  # a comma list of them

SANDBOX_ID_PATTERN = validate._SANDBOX_ID.pattern
CODE_CONTEXT_PATTERN = validate._CODE_CONTEXT.pattern
ENV_NAME_PATTERN = validate._ENV_NAME.pattern
TEMPLATE_NAME_PATTERN = _TEMPLATE_NAME.pattern
NO_NUL_PATTERN = r"^[^\x00]*$"
_NAME = rf"[^/\x00]{{0,{MAX_NAME}}}"
_ABSOLUTE = rf"/(?:{_NAME}/)*{_NAME}"
PATH_PATTERN = f"^{_ABSOLUTE}$"  # absolute, no NUL byte, names the kernel takes
CWD_PATTERN = f"^(?:{_ABSOLUTE})?$"  # empty: the template's working directory
# files.write goes through a temporary file beside its target, named `.{name}.abx-` and
# 12 hex digits: the name and the path it writes have that much less room.
WRITE_SPARE = len(".") + len(".abx-") + 12


def _file_pattern(spare: int = 0) -> str:
    """A path that names a file (read, written, removed, renamed): its last name is not
    empty, `.` or `..`, which are directories (or the root) whatever the sandbox holds."""
    n = MAX_NAME - spare
    last = (rf"(?:[^/\x00.][^/\x00]{{0,{n - 1}}}|\.[^/\x00.][^/\x00]{{0,{n - 2}}}"
            rf"|\.\.[^/\x00]{{1,{n - 2}}})")
    return rf"^/(?:{_NAME}/)*{last}$"


# Whitespace as str.strip() sees it (validate.command), spelled out: JSON Schema's \s
# leaves out \x1c-\x1f. A command needs one other character, and no NUL byte.
_SPACE = "".join(f"\\u{i:04x}" for i in range(0x10000) if chr(i).isspace())
COMMAND_PATTERN = rf"^[^\x00]*[^\x00{_SPACE}][^\x00]*$"
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_BASE64 = re.compile(BASE64_PATTERN)


def whole_match(pattern: str, value: str, what: str) -> str:
    """After the engine's check: its pattern's ``$`` also takes a final newline, JSON
    Schema's (and this gateway's) does not."""
    if not re.fullmatch(pattern, value):
        raise InvalidArgumentError(f"invalid {what} {value!r}")
    return value


def base64_bytes(value: str | None, what: str) -> bytes | None:
    """Exactly what BASE64_PATTERN allows (b64decode alone also takes excess padding)."""
    if value is None:
        return None
    if not _BASE64.fullmatch(value):
        raise InvalidArgumentError(f"{what} is not valid base64")
    return base64.b64decode(value, validate=True)


def positive(what: str, maximum: float, *, integer: bool = False,
             allow_none: bool = False) -> AfterValidator:
    """The engine's check of a number in (0, maximum]."""

    def check(value: Any) -> Any:
        try:
            return validate.positive(value, what, allow_none=allow_none, maximum=maximum,
                                     integer=integer)
        except OverflowError:  # float() of a huge integer, in the whole-number test
            bound = "greater than 0" if value <= 0 else f"at most {maximum}"
            raise InvalidArgumentError(f"{what} must be {bound}, got {value}") from None

    return AfterValidator(check)


def _number(maximum: float, **more: Any) -> Any:
    return Field(json_schema_extra={"exclusiveMinimum": 0, "maximum": maximum, **more})


def _integer(minimum: int, maximum: int, **more: Any) -> WithJsonSchema:
    # `int | float` below, strict: 32.0 is an integer to JSON Schema, and to the engine.
    return WithJsonSchema({"type": "integer", "minimum": minimum, "maximum": maximum, **more})


def path_schema(*, file: bool = False, spare: int = 0) -> dict[str, Any]:
    """JSON Schema keywords of a path: any absolute one, or one that names a ``file``
    with ``spare`` characters left in its name and in the whole."""
    pattern = _file_pattern(spare) if file else PATH_PATTERN
    return {"pattern": pattern, "maxLength": MAX_PATH - spare}


def checked_path(value: str, what: str, *, file: bool = False, spare: int = 0) -> str:
    """The engine's check of an absolute path, then what path_schema() states."""
    validate.path(value, what)
    if len(value) > MAX_PATH - spare:
        raise InvalidArgumentError(f"{what} is longer than {MAX_PATH - spare} characters"
                                   + (" (a file is written through a temporary one beside "
                                      "it)" if spare else ""))
    if any(len(name) > MAX_NAME for name in value.split("/")):
        raise InvalidArgumentError(f"{what} {value!r} has a name longer than {MAX_NAME} "
                                   "characters")
    if not file:
        return value
    last = value.rsplit("/", 1)[1]
    if last in ("", ".", ".."):
        raise InvalidArgumentError(f"{what} {value!r} names no file: it ends with '/', '.' "
                                   "or '..'")
    if len(last) > MAX_NAME - spare:
        raise InvalidArgumentError(f"{what} {value!r}: a file written here has a name of at "
                                   f"most {MAX_NAME - spare} characters (it is written "
                                   "through a temporary one beside it)")
    return value


def absolute(what: str, *, file: bool = False, spare: int = 0) -> AfterValidator:
    return AfterValidator(lambda v: checked_path(v, what, file=file, spare=spare))


def _cpu(value: float) -> float:
    if value < MIN_CPU:
        raise InvalidArgumentError(f"cpu must be at least {MIN_CPU} (the smallest CPU quota "
                                   f"the kernel allows), got {value!r}")
    return value


def _cwd(value: str) -> str:
    return checked_path(value, "cwd") if value else value  # empty: the default


def _envs(value: dict[str, str]) -> dict[str, str]:
    validate.envs(value)
    for name in value:
        whole_match(ENV_NAME_PATTERN, name, "environment variable name")
    return value


def _text(value: Any, where: str = "body") -> None:
    """JSON can escape lone surrogates (``"\\ud800"``), which are not Unicode text: no
    command, path or stdin can carry one."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"{where}: not valid Unicode text (a lone "
                                       "surrogate)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _text(key, where)
            _text(item, f"{where}.{key}" if isinstance(key, str) else where)
    elif isinstance(value, list):
        for item in value:
            _text(item, where)


CommandTimeout = Annotated[
    float, _number(MAX_COMMAND_TIMEOUT),
    positive("timeout", MAX_COMMAND_TIMEOUT)]
SandboxTimeout = Annotated[
    float, _number(MAX_SANDBOX_TIMEOUT, description="idle seconds before auto-pause"),
    positive("timeout", MAX_SANDBOX_TIMEOUT)]
AbsolutePath = Annotated[str, Field(json_schema_extra=path_schema()), absolute("path")]
Cwd = Annotated[str, Field(json_schema_extra={
    "pattern": CWD_PATTERN, "maxLength": MAX_PATH,
    "description": "absolute; empty or null: the template's working directory"}),
    AfterValidator(_cwd)]
Envs = Annotated[dict[str, str], WithJsonSchema({
    "type": "object", "propertyNames": {"pattern": ENV_NAME_PATTERN},
    "additionalProperties": {"type": "string", "pattern": NO_NUL_PATTERN}}),
    AfterValidator(_envs)]
Command = Annotated[str, Field(json_schema_extra={
    "pattern": COMMAND_PATTERN, "description": "run by /bin/sh -c"}),
    AfterValidator(validate.command)]
UserName = Annotated[str, Field(json_schema_extra={
    "pattern": validate.USER_NAME_PATTERN, "description": "an account inside the sandbox "
    "to run as (default root); `user` (uid 1000) exists in every template"}),
    AfterValidator(validate.user)]
Base64 = Annotated[str, Field(json_schema_extra={"pattern": BASE64_PATTERN})]
Language = Annotated[str, Field(json_schema_extra={"enum": list(LANGUAGES)})]
CodeContextId = Annotated[str, Field(json_schema_extra={"pattern": CODE_CONTEXT_PATTERN})]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        _text(data)
        return data


NetworkEntry = Annotated[str, Field(min_length=1, max_length=MAX_NETWORK_ENTRY)]
NetworkEntries = Annotated[list[NetworkEntry], Field(max_length=MAX_NETWORK_ENTRIES)]


class NetworkPolicyBody(_Body):
    """E2B's shape: ``allow_out`` names, ``*.`` wildcards, CIDRs and presets; ``deny_out``
    wins over it. Without ``mode``: allowlist if allow_out, else full if deny_out, else off."""

    mode: Annotated[str, Field(json_schema_extra={"enum": list(netpolicy.MODES)})] | None = None
    allow_out: NetworkEntries | None = None
    deny_out: NetworkEntries | None = None


def _network(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """The schema's types first; whatever they refuse, netpolicy explains (one clear
    message, the SDK's, instead of one complaint per branch of the union)."""
    try:
        checked = handler(value)
    except ValidationError:
        netpolicy.parse(value)  # raises InvalidArgumentError naming what is wrong
        raise InvalidArgumentError(
            "network: give true/false, a string (off, full, a preset, a comma list), an "
            "array of entries, or {mode, allow_out, deny_out} with allow_out and deny_out "
            "arrays of strings") from None
    policy_of(checked)  # netpolicy's own check of the entries: the SDK's message
    return checked


Network = Annotated[
    bool | Annotated[str, Field(max_length=MAX_NETWORK_TEXT)] | NetworkEntries
    | NetworkPolicyBody,
    Field(description="false/`off` (loopback only), true/`full`, a preset (`registries`), "
          "a comma list or array of host names, `*.` wildcards and CIDRs (an allowlist), or "
          "{mode, allow_out, deny_out}; never beyond the gateway's or the API key's network "
          "ceiling (403)"),
    WrapValidator(_network)]


def policy_of(value: Any) -> netpolicy.NetworkPolicy:
    """A body's network field as the policy it names."""
    if isinstance(value, NetworkPolicyBody):
        value = value.model_dump(exclude_none=True)
    return netpolicy.parse(value)


class CreateSandbox(_Body):
    template: Annotated[str, Field(json_schema_extra={"pattern": TEMPLATE_NAME_PATTERN}),
                        AfterValidator(validate_name)] = "base"
    timeout: SandboxTimeout = 300
    envs: Envs | None = None
    cpu: Annotated[float, Field(json_schema_extra={
        "minimum": MIN_CPU, "maximum": MAX_CPU, "description": "CPUs, at most the host's"}),
        positive("cpu", MAX_CPU), AfterValidator(_cpu)] | None = None
    memory_mb: Annotated[int | float, _integer(MIN_MEMORY_MB, MAX_MEMORY_MB),
                         positive("memory_mb", MAX_MEMORY_MB, integer=True)] | None = None
    disk_mb: Annotated[int | float, _integer(MIN_DISK_MB, MAX_DISK_MB),
                       positive("disk_mb", MAX_DISK_MB, integer=True)] | None = None
    network: Network = False
    persistent: bool = False
    metadata: dict[str, str] | None = None
    volume: str | None = None


class SetTimeout(_Body):
    timeout: SandboxTimeout


class SetNetwork(_Body):
    network: Network


_ONE_OF_STDIN = {"not": {"required": ["stdin", "stdin_base64"], "properties": {
    "stdin": {"type": "string"}, "stdin_base64": {"type": "string"}}},
    "description": "`stdin` and `stdin_base64` are not both given"}


class RunCommand(_Body):
    model_config = ConfigDict(json_schema_extra=_ONE_OF_STDIN)

    cmd: Command
    cwd: Cwd | None = None
    envs: Envs | None = None
    timeout: CommandTimeout | None = None
    stdin: str | None = None
    stdin_base64: Base64 | None = Field(None, description="binary stdin, base64")
    stream: bool = Field(False, description="answer NDJSON events instead of one result")
    user: UserName | None = None


class StartProcess(_Body):
    cmd: Command
    cwd: Cwd | None = None
    envs: Envs | None = None
    user: UserName | None = None


class Started(BaseModel):
    pid: int


class WaitProcess(_Body):
    timeout: CommandTimeout | None = None
    stream: bool = False


class KillProcess(_Body):
    signal: Annotated[int | float, _integer(MIN_SIGNAL, MAX_SIGNAL),
                      positive("signal", MAX_SIGNAL, integer=True)] = 9


class Killed(BaseModel):
    killed: bool


_ONE_OF_DATA = {"not": {"required": ["data", "data_base64"], "properties": {
    "data": {"type": "string"}, "data_base64": {"type": "string"}}},
    "description": "`data` and `data_base64` are not both given"}


class SendStdin(_Body):
    model_config = ConfigDict(json_schema_extra=_ONE_OF_DATA)

    data: str | None = None
    data_base64: Base64 | None = None
    close: bool = False


class CustomCommand(_Body):
    args: list[str] | None = None


class RunCode(_Body):
    code: str
    language: Language = "python"
    timeout: CommandTimeout | None = Field(
        60, description="seconds (null: 60); past it the cell is interrupted and the "
                        "context's variables are kept")
    context: CodeContextId | None = Field(None, description="code context id (default: "
                                                           "`default`)")
    stream: bool = Field(False, description="answer NDJSON events instead of one result")


class CreateCodeContext(_Body):
    cwd: Cwd | None = Field(None, description="working directory (default: the template's)")
    language: Language = "python"
    user: UserName | None = None


class PathBody(_Body):
    path: AbsolutePath


class MakeDirBody(PathBody):
    user: UserName | None = Field(None, description="the account the directories made "
                                  "belong to (default root)")


class RenameBody(_Body):
    src: Annotated[str, Field(json_schema_extra=path_schema(file=True)),
                   absolute("source path", file=True)]
    dst: Annotated[str, Field(json_schema_extra=path_schema(file=True)),
                   absolute("destination path", file=True)]


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
    details: dict[str, Any] = {}
