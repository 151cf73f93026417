"""What a new sandbox is made with: the one definition of ``create``'s options.

Each field carries its meaning (the description every surface shows), its bound, its
JSON Schema and its check. The checks are ``core.validate``'s, so a bad value gets the
same message from the SDK, the REST and E2B APIs, the MCP tools and the CLI. Every
surface derives its model from this one: the SDK's ``Sandbox.create`` signature, the
REST API's request body, the MCP ``create_sandbox`` arguments, the CLI's options and the
E2B mapping. A new option is one field here plus what the service and backends do with it.

JSON types are strict (no ``"1"`` for 1, no ``1`` for true); a Python caller may also
give a network policy as any spelling ``core.network.parse`` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from agent_sandbox.core import bounds, validate
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.network import MODES, NetworkPolicy
from agent_sandbox.core.network import parse as parse_policy
from agent_sandbox.core.secrets import MAX_SECRETS
from agent_sandbox.core.secrets import NAME_PATTERN as SECRET_NAME_PATTERN
from agent_sandbox.core.secrets import check_names as check_secret_names
from agent_sandbox.core.templates import NAME_PATTERN as TEMPLATE_NAME_PATTERN
from agent_sandbox.core.templates import validate_name

NO_NUL_PATTERN = r"^[^\x00]*$"
ON_TIMEOUT = ("pause", "kill")  # what a sandbox's idle timeout does
VOLUME_PATTERN = r"^vol-[a-z0-9]{10}$"
SNAPSHOT_PATTERN = validate.SNAPSHOT_ID_PATTERN


def checked(check: Callable[[Any], Any], schema: dict[str, Any], *,
            nullable: bool = False) -> tuple[PlainValidator, WithJsonSchema]:
    """A field checked by ``check`` (raising InvalidArgumentError, never pydantic's own
    message) and described by ``schema``; ``nullable``: null means "the default"."""
    if nullable:
        schema = {"anyOf": [schema, {"type": "null"}]}
    return PlainValidator(check), WithJsonSchema(schema)


def number_in(what: str, maximum: float, *, minimum: float | None = None,
              integer: bool = False) -> Callable[[Any], Any]:
    """The check of a number in (0, maximum] (and at least ``minimum``), None allowed."""

    def check(value: Any) -> Any:
        try:
            value = validate.positive(value, what, maximum=maximum, integer=integer)
        except OverflowError:  # float() of a huge integer, in the whole-number test
            bound = "greater than 0" if value <= 0 else f"at most {maximum}"
            raise InvalidArgumentError(f"{what} must be {bound}, got {value}") from None
        if value is not None and minimum is not None and value < minimum:
            raise InvalidArgumentError(f"{what} must be at least {minimum}, got {value!r}")
        return value

    return check


def _bool(what: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{what} must be true or false, got {value!r}")
        return value

    return check


def _choice(what: str, options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise InvalidArgumentError(f"{what} must be {' or '.join(map(repr, options))}, "
                                       f"got {value!r}")
        return str(value)

    return check


def _envs(value: Any) -> dict[str, str]:
    return validate.envs(value)


def _metadata(value: Any) -> dict[str, str]:
    return validate.metadata(value)


def _volume(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidArgumentError(f"volume must be a volume id such as 'vol-...', got "
                                   f"{value!r}")
    return value


def _snapshot(value: Any) -> str | None:
    return validate.snapshot_id(value) if value is not None else None


def _timeout(value: Any) -> float:
    return float(validate.positive(value, "timeout", allow_none=False,
                                   maximum=bounds.MAX_SANDBOX_TIMEOUT))


_NETWORK_FORMS = ("network: give true/false, a string (off, full, a preset, a comma list), "
                  "an array of entries, or {mode, allow_out, deny_out} with allow_out and "
                  "deny_out arrays of strings")


def _network(value: Any) -> NetworkPolicy:
    """Any spelling ``core.network.parse`` takes, held to the JSON shapes the schema states
    (a mapping's entries are arrays of strings; no text longer than a full allowlist)."""
    if isinstance(value, Mapping):
        for name in ("allow_out", "deny_out"):
            entries = value.get(name)
            if entries is not None and not (isinstance(entries, list | tuple)
                                            and all(isinstance(e, str) for e in entries)):
                raise InvalidArgumentError(_NETWORK_FORMS)
        if value.get("mode") is not None and not isinstance(value.get("mode"), str):
            raise InvalidArgumentError(_NETWORK_FORMS)
    elif isinstance(value, str) and len(value) > bounds.MAX_NETWORK_TEXT:
        parse_policy(value)  # its own message names what is wrong, and how long it is
        raise InvalidArgumentError(f"network is longer than {bounds.MAX_NETWORK_TEXT} "
                                   "characters")
    elif not isinstance(value, bool | str | list | tuple | NetworkPolicy | None):
        parse_policy(value)  # "network 1 is not understood"
        raise InvalidArgumentError(_NETWORK_FORMS)
    return parse_policy(value)


ENVS_SCHEMA = {"type": "object", "propertyNames": {"pattern": validate.ENV_NAME_PATTERN},
               "additionalProperties": {"type": "string", "pattern": NO_NUL_PATTERN}}
_ENTRIES_SCHEMA = {"type": "array", "maxItems": bounds.MAX_NETWORK_ENTRIES,
                   "items": {"type": "string", "maxLength": bounds.MAX_NETWORK_ENTRY}}
NETWORK_SCHEMA = {"anyOf": [
    {"type": "boolean"},
    {"type": "string", "maxLength": bounds.MAX_NETWORK_TEXT},
    _ENTRIES_SCHEMA,
    {"type": "object", "additionalProperties": False, "properties": {
        "mode": {"type": "string", "enum": list(MODES)},
        "allow_out": _ENTRIES_SCHEMA, "deny_out": _ENTRIES_SCHEMA}},
]}
NETWORK_HELP = ("off (the default: loopback only), full, a preset (registries: PyPI, npm, "
                "Debian/Ubuntu apt), or host names, *.wildcards and CIDRs (an allowlist); "
                "the host, the LAN and cloud metadata are never reachable")


# Fields other bodies share (a timeout change, a network change).
IdleTimeout = Annotated[float, *checked(_timeout, {
    "type": "number", "exclusiveMinimum": 0, "maximum": bounds.MAX_SANDBOX_TIMEOUT,
    "description": "idle seconds before it is auto-paused"})]
Network = Annotated[NetworkPolicy, *checked(_network, NETWORK_SCHEMA)]


class CreateSpec(BaseModel):
    """A sandbox to create. Field order is the SDK's positional order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: Annotated[str, *checked(validate_name, {
        "type": "string", "pattern": TEMPLATE_NAME_PATTERN})] = Field(
        "base", description="the template it starts from")
    timeout: IdleTimeout = Field(
        300, description="idle seconds before it is auto-paused; every use restarts the "
                         "clock")
    envs: Annotated[dict[str, str], *checked(_envs, ENVS_SCHEMA, nullable=True)] = Field(
        default_factory=dict, description="environment variables of everything run in it")
    cpu: Annotated[float | None, *checked(
        number_in("cpu", bounds.MAX_CPU_ANY, minimum=bounds.MIN_CPU),
        {"type": "number", "minimum": bounds.MIN_CPU, "maximum": bounds.MAX_CPU_ANY},
        nullable=True)] = Field(None, description="CPU limit in cores (at most the host's)")
    memory_mb: Annotated[int | None, *checked(
        number_in("memory_mb", bounds.MAX_MEMORY_MB, minimum=bounds.MIN_MEMORY_MB,
                  integer=True),
        {"type": "integer", "minimum": bounds.MIN_MEMORY_MB, "maximum": bounds.MAX_MEMORY_MB},
        nullable=True)] = Field(None, description="memory limit in MiB (at most the host's)")
    disk_mb: Annotated[int | None, *checked(
        number_in("disk_mb", bounds.MAX_DISK_MB, minimum=bounds.MIN_DISK_MB, integer=True),
        {"type": "integer", "minimum": bounds.MIN_DISK_MB, "maximum": bounds.MAX_DISK_MB},
        nullable=True)] = Field(None, description="disk limit in MiB (system layer and "
                                                  "/workspace)")
    network: Network = Field(
        default_factory=NetworkPolicy, description="what it may connect to: " + NETWORK_HELP)
    persistent: Annotated[bool, *checked(_bool("persistent"), {"type": "boolean"})] = Field(
        False, description="outlive the MCP session that made it")
    metadata: Annotated[dict[str, str], *checked(_metadata, {
        "type": "object", "additionalProperties": {"type": "string"}}, nullable=True)] = Field(
        default_factory=dict, description="your own labels, listed with it")
    volume: Annotated[str | None, *checked(_volume, {
        "type": "string", "pattern": VOLUME_PATTERN}, nullable=True)] = Field(
        None, description="a kept /workspace volume to attach (from an earlier sandbox)")
    lifetime: Annotated[float | None, *checked(
        number_in("lifetime", bounds.MAX_LIFETIME),
        {"type": "number", "exclusiveMinimum": 0, "maximum": bounds.MAX_LIFETIME},
        nullable=True)] = Field(None, description="seconds from its start after which it "
                                                  "ends, busy or not (unset: no end)")
    on_timeout: Annotated[str, *checked(_choice("on_timeout", ON_TIMEOUT), {
        "type": "string", "enum": list(ON_TIMEOUT)})] = Field(
        "pause", description="what its idle timeout does: pause it (files kept, any use "
                             "resumes it) or kill it")
    snapshot: Annotated[str | None, *checked(_snapshot, {
        "type": "string", "pattern": SNAPSHOT_PATTERN}, nullable=True)] = Field(
        None, description="a snapshot to start from: its processes, memory and files "
                          "(a fork of the sandbox it was taken of)")
    keep_volume: Annotated[bool, *checked(_bool("keep_volume"), {"type": "boolean"})] = Field(
        True, description="keep its /workspace volume when it ends by itself (lifetime, "
                          "on_timeout kill, the operator's maximum age)")
    secrets: Annotated[list[str], *checked(check_secret_names, {
        "type": "array", "maxItems": MAX_SECRETS,
        "items": {"type": "string", "pattern": SECRET_NAME_PATTERN}}, nullable=True)] = Field(
        default_factory=list, description="names of stored secrets it may use: it sees "
        "only placeholders (abx-secret:NAME), swapped for the value by its network proxy "
        "on requests to the secret's hosts")

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        validate.unicode_text(data)
        return data

    @classmethod
    def of(cls, options: Mapping[str, Any] | CreateSpec | None = None,
           **more: Any) -> CreateSpec:
        """Options by name as a checked spec (None is always "the default"); an unknown
        name or a bad value is an InvalidArgumentError naming it."""
        if isinstance(options, CreateSpec) and not more:
            return options
        given = {**(options.model_dump() if isinstance(options, CreateSpec) else
                    options or {}), **more}
        known_names(given)
        try:
            return cls.model_validate({k: v for k, v in given.items() if v is not None})
        except ValidationError as exc:  # only a schema-level type error gets here
            raise InvalidArgumentError(describe(exc)) from None

    def options(self) -> dict[str, Any]:
        """Every option by name, checked (the network a NetworkPolicy): what
        ``Provider.create`` takes without checking again."""
        return {name: getattr(self, name) for name in type(self).model_fields}


OPTION_NAMES = tuple(CreateSpec.model_fields)


def known_names(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """A TypeError naming any option that does not exist, as a Python signature would."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"create() got unexpected option(s) {', '.join(unknown)}; the "
                        f"options are {', '.join(OPTION_NAMES)}")
    return options


def describe(exc: ValidationError) -> str:
    """pydantic's errors as one sentence: which option, and what was wrong."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "options"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def sdk_defaults() -> dict[str, Any]:
    """``create()``'s keywords and their defaults as the SDK shows them: a mapping's
    default is None (an empty one), a network's False (off)."""
    out = {}
    for name, info in CreateSpec.model_fields.items():
        default = info.get_default(call_default_factory=True)
        if isinstance(default, dict | list):
            default = None
        elif isinstance(default, NetworkPolicy):
            default = False
        out[name] = default
    return out

