"""Request and response bodies, and what every input of the gateway may be.

The engine's validation (``agent_sandbox.core.validate``, the engine's and the guest's
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
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from agent_sandbox.core import code_languages, validate
from agent_sandbox.core.bounds import (
    MAX_COMMAND_TIMEOUT,
    MAX_LOCK_TOKEN,
    MAX_LOCK_TTL,
    MAX_LOCK_WAIT,
    MAX_NAME,
    MAX_PATH,
    MAX_SIGNAL,
    MIN_SIGNAL,
)
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.recipe import MAX_RECIPE_BYTES
from agent_sandbox.core.spec import NO_NUL_PATTERN, IdleTimeout, Network
from agent_sandbox.core.states import VISIBLE
from agent_sandbox.core.templates import NAME_PATTERN

LANGUAGES = code_languages.NAMES
SANDBOX_STATES = VISIBLE

SANDBOX_ID_PATTERN = validate.SANDBOX_ID_PATTERN
CODE_CONTEXT_PATTERN = validate.CODE_CONTEXT_PATTERN
ENV_NAME_PATTERN = validate.ENV_NAME_PATTERN
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


def positive(what: str, maximum: float, *, integer: bool = False, allow_none: bool = False,
             why: str = "") -> AfterValidator:
    """The engine's check of a number in (0, maximum]."""

    def check(value: Any) -> Any:
        try:
            return validate.positive(value, what, allow_none=allow_none, maximum=maximum,
                                     integer=integer, why=why)
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


def _cwd(value: str) -> str:
    return checked_path(value, "cwd") if value else value  # empty: the default


def _envs(value: dict[str, str]) -> dict[str, str]:
    validate.envs(value)
    for name in value:
        whole_match(ENV_NAME_PATTERN, name, "environment variable name")
    return value


CommandTimeout = Annotated[
    float, _number(MAX_COMMAND_TIMEOUT),
    positive("timeout", MAX_COMMAND_TIMEOUT)]
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
        validate.unicode_text(data)
        return data


class SetTimeout(_Body):
    timeout: IdleTimeout


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
    language: Language | None = Field(None, description="default: the context's, else "
                                      "python")
    timeout: CommandTimeout | None = Field(
        60, description="seconds (null: 60); past it the cell is interrupted and the "
                        "context's variables are kept")
    context: CodeContextId | None = Field(None, description="code context id (default: "
                                                           "`default`)")
    stream: bool = Field(False, description="answer NDJSON events instead of one result")


class CreateCodeContext(_Body):
    cwd: Cwd | None = Field(None, description="working directory (default: the template's)")
    language: Language | None = Field(None, description="default: python")
    user: UserName | None = None


class MakeDir(_Body):
    path: AbsolutePath
    user: UserName | None = Field(None, description="owner of the directories made")


class RenameBody(_Body):
    src: Annotated[str, Field(json_schema_extra=path_schema(file=True)),
                   absolute("source path", file=True)]
    dst: Annotated[str, Field(json_schema_extra=path_schema(file=True)),
                   absolute("destination path", file=True)]


class Written(BaseModel):
    size: int


_LockFile = Annotated[str, Field(description="absolute path of the file",
                                 json_schema_extra=path_schema(file=True)),
                      absolute("path", file=True)]
_Token = Annotated[str, Field(description="the token lock gave", min_length=1,
                              max_length=MAX_LOCK_TOKEN, pattern=r"^[0-9a-f]+$")]


HOLDER_PATTERN = r"^[A-Za-z0-9 ._:@/+-]+$"  # a lock holder's name, as clients give it


class LockBody(_Body):
    path: _LockFile
    ttl: float = Field(60.0, gt=0, le=MAX_LOCK_TTL, description="seconds the lock lives "
                       "unless renewed (lock again with its token) or released")
    wait: float = Field(0.0, ge=0, le=MAX_LOCK_WAIT, description="seconds to wait for "
                        "another holder's lock or write to end")
    token: _Token | None = Field(None, description="renew the lock this token names")
    holder: str | None = Field(None, min_length=1, max_length=120, pattern=HOLDER_PATTERN,
                               description="a name "
                               "for the holder (others see it in 'locked' errors; default: "
                               "'rest'); shown after the API key's name")


class UnlockBody(_Body):
    path: _LockFile
    token: _Token


class Released(BaseModel):
    released: int


class Exists(BaseModel):
    exists: bool


class Health(BaseModel):
    status: str
    sandboxes: int | None = Field(None, description="live ones the caller may see (a key's)")


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict[str, Any] = {}


class BuildTemplate(_Body):
    name: str = Field(pattern=NAME_PATTERN, description="the template's name")
    recipe: str = Field(max_length=MAX_RECIPE_BYTES, description=(
        "a Dockerfile: FROM, RUN, COPY/ADD, ENV, WORKDIR, USER, ARG, LABEL, CMD/ENTRYPOINT, "
        "HEALTHCHECK CMD"))
    context_base64: Base64 | None = Field(None, description=(
        "the files COPY reads: a tar archive (gzip or not), base64; the request body is "
        "capped at 16 MiB"))
