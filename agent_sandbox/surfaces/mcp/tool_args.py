"""Every tool's arguments, declared once: the schema in tools/list and the check of a call.

Bounds are the engine's (idle timeout, pid range) or what every JSON client keeps exactly
(byte offsets); see ``args`` for how a model becomes a schema and a refusal.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainValidator,
    WithJsonSchema,
    create_model,
)

from agent_sandbox.core import network as netpolicy
from agent_sandbox.core.bounds import MAX_LOCK_TOKEN, MAX_LOCK_TTL, MAX_LOCK_WAIT, MAX_VERSION
from agent_sandbox.core.code_languages import LANGUAGES
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.spec import OPTION_NAMES, CreateSpec
from agent_sandbox.core.states import VISIBLE
from agent_sandbox.core.validate import ENV_NAME_PATTERN, is_env_name
from agent_sandbox.surfaces.mcp.args import ToolArgs, refuse, shown

MAX_TIMEOUT = 86400  # a day: commands and code cells
MAX_BYTE = (1 << 53) - 1  # offsets: the largest integer every JSON client keeps exactly
MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT
MAX_PATH = 4096  # the kernel's PATH_MAX
MAX_NETWORK = 8192  # a comma list of names: room for a few dozen
NETWORK_PATTERN = r"^[A-Za-z0-9.,:/*\s-]*$"  # names, wildcards, CIDRs, commas
NETWORK_FORMS = ("a string: 'off' (loopback only), 'registries' (package registries), "
                 "'full', or comma-separated host names, *.wildcards and CIDRs")


def _whole_float_as_int(value: Any) -> Any:
    """JSON has one number type: 7.0 is the integer 7 (7.5 stays a float and is refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _env_names(envs: dict[str, str]) -> dict[str, str]:
    for name in envs:
        if not is_env_name(name):
            raise refuse(says=f"has an invalid environment variable name {shown(name)}: names "
                         "are ASCII letters, digits and '_', not starting with a digit")
    return envs


def _file_mode(value: Any) -> int:
    """A permission mode as an octal string ('0644', '0o755', '644'). A number is refused:
    whether 644 meant octal or decimal cannot be told, and a wrong guess is a wrong mode."""
    text = value.strip().lower().removeprefix("0o") if isinstance(value, str) else ""
    if not 0 < len(text) <= 6 or any(digit not in "01234567" for digit in text):
        raise refuse("an octal string such as '0644'" + (
            " (a string: a number could be read as octal or decimal)"
            if isinstance(value, int | float) and not isinstance(value, bool) else ""))
    mode = int(text, 8)
    if mode > 0o7777:
        raise refuse("an octal string such as '0644' (at most '7777')")
    return mode


def _network_policy(value: Any) -> netpolicy.NetworkPolicy:
    """A policy as one string (our tool schemas never take a union of types): off, full,
    a preset, or a comma list. The operator's ceiling is checked by the tool."""
    if not isinstance(value, str):
        raise refuse(NETWORK_FORMS)
    if len(value) > MAX_NETWORK:
        raise refuse(f"at most {MAX_NETWORK} characters long")
    try:
        return netpolicy.parse(value)
    except InvalidArgumentError as exc:
        raise refuse(says=f"is not a network policy: {exc.message}") from None


_WHOLE = BeforeValidator(_whole_float_as_int)
Pid = Annotated[int, Field(ge=1, le=MAX_PID), _WHOLE]
ByteOffset = Annotated[int, Field(ge=0, le=MAX_BYTE), _WHOLE]
LockWait = Annotated[float, Field(ge=0, le=MAX_LOCK_WAIT)]
LockTtl = Annotated[float, Field(ge=0.001, le=MAX_LOCK_TTL)]
ByteCount = Annotated[int, Field(ge=1, le=MAX_BYTE), _WHOLE]
Depth = Annotated[int, Field(ge=1, le=64), _WHOLE]
Port = Annotated[int, Field(ge=1, le=65535), _WHOLE]
Envs = Annotated[dict[str, str], AfterValidator(_env_names), WithJsonSchema(
    {"type": "object", "additionalProperties": {"type": "string"},
     "propertyNames": {"pattern": ENV_NAME_PATTERN}})]
NetworkPolicyArg = Annotated[netpolicy.NetworkPolicy, PlainValidator(_network_policy),
                             WithJsonSchema({"type": "string", "maxLength": MAX_NETWORK,
                                             "pattern": NETWORK_PATTERN})]
NETWORK_HELP = ("Outbound network: 'off' (loopback only, names do not resolve), "
                "'registries' (PyPI, npm, Debian/Ubuntu apt: for pip/npm/apt installs), "
                "comma-separated host names, *.wildcards and CIDRs (e.g. "
                "'pypi.org,files.pythonhosted.org,*.github.com'), or 'full' (any public "
                "address). The host, the LAN and cloud metadata are never reachable. At most "
                "this server's ceiling (see the tool description).")
FileMode = Annotated[int, PlainValidator(_file_mode), WithJsonSchema(
    {"type": "string", "pattern": "^\\s*(0[oO])?[0-7]{1,6}\\s*$", "maxLength": 8})]
Encoding = Literal["utf-8", "base64"]

# Arguments several tools share.
SANDBOX_ID = Field(None, max_length=128, description="Sandbox to use. Omit to use this "
                   "session's default sandbox (created on first use).")
PID = Field(description="The pid run_command returned.")
FILE_PATH = Field(min_length=1, max_length=MAX_PATH,
                  description="Absolute path, or relative to /workspace.")
ENCODING = Field("utf-8", description="Default utf-8.")


# ---- lifecycle ------------------------------------------------------------------------------

# The create options a model may set: every one of core.spec.CreateSpec but those for
# programs and operators (a kept volume, labels, the disk size). A new option reaches the
# tool by itself, in the plain form a model's schema dialect takes.
NOT_FOR_MODELS = ("volume", "metadata", "disk_mb")
# Where the tool says more to a model than the option's own description.
MODEL_TEXT = {
    "template": "Template name. Omit for the server's default.",
    "network": NETWORK_HELP + " Default 'off'.",
    "persistent": "Keep it after this session ends (default false: destroyed with the "
                  "session).",
}


def _option_arg(name: str) -> tuple[Any, Any]:
    """One create option as a tool argument: its type and bounds from the spec's schema,
    refused with the tool's own messages (``args``)."""
    info = CreateSpec.model_fields[name]
    schema = CreateSpec.model_json_schema()["properties"][name]
    plain = next((b for b in schema.get("anyOf", [schema]) if b.get("type") != "null"), schema)
    default = info.get_default(call_default_factory=True)
    text = MODEL_TEXT.get(name) or f"{(info.description or name)[:1].upper()}" \
        f"{(info.description or name)[1:]}."
    if name == "network":
        return NetworkPolicyArg, Field(netpolicy.NetworkPolicy(), description=text)
    if name == "template":
        return str | None, Field(None, max_length=128, description=text)
    kind = plain.get("type")
    # Every number a model sees has a minimum and a maximum: an exclusive minimum becomes
    # the smallest step above it (a millisecond of a timeout).
    low = plain.get("minimum")
    if low is None and "exclusiveMinimum" in plain:
        low = plain["exclusiveMinimum"] + (1 if kind == "integer" else 0.001)
    limits = {k: v for k, v in (("ge", low), ("le", plain.get("maximum"))) if v is not None}
    if kind == "number":
        base: Any = Annotated[float, Field(**limits)]
    elif kind == "integer":
        base = Annotated[int, Field(**limits), _WHOLE]
    elif kind == "boolean":
        base = bool
    elif kind == "object":
        base = Envs if "propertyNames" in plain else dict[str, str]
    elif "enum" in plain:
        base = Literal[tuple(plain["enum"])]
    else:
        base = Annotated[str, Field(max_length=plain.get("maxLength", 4096))]
    if default is None or isinstance(default, dict):
        return base | None, Field(None, description=text)
    if "efault" not in text:
        text += f" Default {json.dumps(default)}."
    return base, Field(default, description=text)


CreateSandboxArgs: type[ToolArgs] = create_model(  # type: ignore[call-overload]
    "CreateSandboxArgs", __base__=ToolArgs,
    **{name: _option_arg(name) for name in OPTION_NAMES if name not in NOT_FOR_MODELS})


class ListSandboxesArgs(ToolArgs):
    template: str | None = Field(None, max_length=128, description="Only this template.")
    state: Literal[VISIBLE] | None = Field(None, description="Only this state.")  # type: ignore[valid-type]


class ListTemplatesArgs(ToolArgs):
    """list_templates: no arguments."""


class SandboxArgs(ToolArgs):
    """pause_sandbox, resume_sandbox, reset_rootfs, kill_sandbox."""

    sandbox_id: str | None = Field(None, max_length=128, description="Sandbox to act on. "
                                   "Omit for this session's default sandbox.")


class SetNetworkArgs(ToolArgs):
    network: NetworkPolicyArg = Field(description=NETWORK_HELP)
    sandbox_id: str | None = Field(None, max_length=128, description="Sandbox to change. "
                                   "Omit for this session's default sandbox.")


class ExposePortArgs(SandboxArgs):
    port: Port = Field(description="The TCP port a server listens on inside the sandbox "
                       "(on 127.0.0.1 or 0.0.0.0 there).")


class SnapshotSandboxArgs(SandboxArgs):
    name: str | None = Field(None, max_length=64, description="Your label for the snapshot "
                             "(optional).")


class KillSandboxArgs(SandboxArgs):
    delete_volumes: bool = Field(False, description="Also delete its /workspace volume "
                                 "(default false).")


# ---- code and commands ----------------------------------------------------------------------

class RunCodeArgs(ToolArgs):
    code: str = Field(min_length=1, description="The code to run.")
    language: str | None = Field(None, max_length=32, description="Language: "
                                 f"{', '.join(LANGUAGES)} (default: the context's, else "
                                 "python; each has a default context of its own).")
    timeout: float = Field(60, ge=0.001, le=MAX_TIMEOUT, description="Seconds before the cell "
                           "is interrupted (default 60).")
    context: str | None = Field(None, max_length=64, description="Interpreter context id "
                                "(default: the sandbox's default context).")
    sandbox_id: str | None = SANDBOX_ID


class RunCommandArgs(ToolArgs):
    command: str = Field(min_length=1, description="Shell command line.")
    workdir: str = Field("/workspace", max_length=MAX_PATH,
                         description="Working directory (default /workspace).")
    background: bool = Field(False, description="Return at once with a pid (default false).")
    timeout: float = Field(60, ge=0.001, le=MAX_TIMEOUT, description="Seconds before a "
                           "foreground command is killed (default 60).")
    envs: Envs | None = Field(None, description="Extra environment variables.")
    sandbox_id: str | None = SANDBOX_ID


class ProcessArgs(ToolArgs):
    """process_output, kill_process: a background command."""

    required_hints: ClassVar[dict[str, str]] = {
        "pid": "from run_command with background=true"}

    pid: Pid = PID
    sandbox_id: str | None = SANDBOX_ID


# ---- files ----------------------------------------------------------------------------------

class ReadFileArgs(ToolArgs):
    path: str = FILE_PATH
    encoding: Encoding = ENCODING
    offset: ByteOffset = Field(0, description="First byte to read (default 0).")
    limit: ByteCount | None = Field(None, description="Most bytes to read.")
    sandbox_id: str | None = SANDBOX_ID


class WriteFileArgs(ToolArgs):
    required_hints: ClassVar[dict[str, str]] = {"content": "may be empty"}

    path: str = FILE_PATH
    content: str = Field(description="The whole new content.")
    encoding: Encoding = ENCODING
    mode: FileMode = Field(0o644, description="Permissions as an octal string, e.g. '0755' "
                           "(default '0644').")
    if_match: str | None = Field(None, min_length=1, max_length=MAX_VERSION,
                                 description="The version read_file gave: write only if the "
                                 "file is unchanged since (else a 'conflict' error).")
    lock_token: str | None = Field(None, min_length=1, max_length=MAX_LOCK_TOKEN,
                                   description="Your lock_file token, if you locked it.")
    lock_wait: LockWait | None = Field(None, description="Seconds to wait for another "
                                       "writer or lock (default 3).")
    sandbox_id: str | None = SANDBOX_ID


class LockFileArgs(ToolArgs):
    path: str = FILE_PATH
    ttl: LockTtl = Field(60, description="Seconds the lock lasts unless renewed or "
                         "released (default 60).")
    wait: LockWait = Field(0, description="Seconds to wait for another's lock (default 0).")
    renew: str | None = Field(None, min_length=1, max_length=MAX_LOCK_TOKEN,
                              description="Your lock's token: extend it by ttl.")
    sandbox_id: str | None = SANDBOX_ID


class UnlockFileArgs(ToolArgs):
    path: str = FILE_PATH
    token: str = Field(min_length=1, max_length=MAX_LOCK_TOKEN,
                       description="The token lock_file gave.")
    sandbox_id: str | None = SANDBOX_ID


class ListFilesArgs(ToolArgs):
    path: str = Field("/workspace", max_length=MAX_PATH,
                      description="Directory (default /workspace).")
    depth: Depth = Field(1, description="Levels to descend (default 1).")
    sandbox_id: str | None = SANDBOX_ID
