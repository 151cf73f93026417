"""Every host-side setting of agent-sandbox: one typed object, read from the environment.

Each field is one environment variable (its alias, ``ABX_...``); its description is the
documentation (``python -m agent_sandbox.config.reference docs/configuration.md`` writes the table
there, and a test keeps them equal). The environment is read only when a ``Settings`` is
constructed: at the entry points (the ``abx`` CLI, the MCP servers, the
gateway) or, when a caller gives none, by the SDK's provider selection. Everything below
takes the object (or the values it needs) as a parameter.

A blank variable means its default, except where blank has a meaning of its own
(``ABX_MCP_AUDIT_LOG``: auditing off; ``ABX_MCP_AUTH_TOKEN``: refuse every request).
Variables read by the guest agent inside a sandbox are not here: the host sets those.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from agent_sandbox.core.errors import InvalidArgumentError

if TYPE_CHECKING:
    from agent_sandbox.core.network import NetworkPolicy

DEFAULT_DAEMON_SOCKET = "/run/abx/abx.sock"
# Blank is a value of these (see the module docstring); blank is the default for the rest.
BLANK_MEANS_SOMETHING = frozenset({"ABX_MCP_AUDIT_LOG", "ABX_MCP_AUTH_TOKEN"})
CommaList = Annotated[tuple[str, ...], NoDecode]
EngineKind = Literal["auto", "embedded", "rootless", "daemon", "remote", "kubernetes",
                     "memory"]
ENGINES: tuple[str, ...] = get_args(EngineKind)


class SettingsError(InvalidArgumentError):
    """An environment variable with a value its setting cannot take (the message names it)."""


def builtin_data_dir() -> Path:
    """The engine's state directory when ABX_DATA_DIR is not set."""
    if os.geteuid() == 0:
        return Path("/var/lib/agent-sandbox")
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "agent-sandbox"


def _abx_run(name: str = "") -> Path:
    return Path(os.path.expanduser("~")) / ".abx" / "run" / name


def _var(name: str, description: str, *, shown_default: str | None = None,
         config_key: str | None = None, secret: bool = False, **kw: Any) -> Any:
    """A field read from the environment variable ``name``. ``shown_default`` is what the
    docs say when the default is computed; ``config_key`` also makes it an ``abx config``
    key; a ``secret`` is masked wherever it is shown."""
    extra = {"shown_default": shown_default, "config_key": config_key, "secret": secret}
    return Field(alias=name, description=description, repr=not secret,
                 json_schema_extra={k: v for k, v in extra.items() if v}, **kw)


class _EnvSource(EnvSettingsSource):
    """The environment, with a blank variable treated as unset where blank means nothing."""

    def __call__(self) -> dict[str, Any]:
        return {name: value for name, value in super().__call__().items()
                if name in BLANK_MEANS_SOMETHING
                or not (isinstance(value, str) and not value.strip())}


class Settings(BaseSettings):
    """The settings of one process (frozen: change one with ``model_copy(update=...)``)."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True,
                                      populate_by_name=True, str_strip_whitespace=True)

    # Which engine: the rules are in providers/choice.py.
    engine: EngineKind = _var(
        "ABX_ENGINE", "Force the engine: `embedded` (root), `rootless`, `daemon`, `remote`, "
        "`kubernetes` (docs/kubernetes.md) or `memory` (tests and development, no isolation: "
        "docs/architecture.md); `auto` chooses (docs/daemon.md).", default="auto")
    sandbox_api_key: str = _var(
        "ABX_SANDBOX_API_KEY", "API key sent to the remote gateway.",
        config_key="sandbox_api_key", secret=True, default="")
    sandbox_base_url: str = _var(
        "ABX_SANDBOX_BASE_URL", "A remote gateway (`http(s)://host:port`) or a daemon socket "
        "(`unix:///path`); unset: this host's engine.", config_key="base_url", default="")
    sandbox_region: str = _var(
        "SANDBOX_REGION", "Region of the remote gateway (passed on to MCP client configs and "
        "deployments).", config_key="region", default="")
    sandbox_retry_seconds: float = _var(
        "ABX_SANDBOX_RETRY_SECONDS", "How long the remote client retries a gateway it cannot "
        "reach (seconds).", default=30.0, ge=0)
    daemon_socket: str = _var(
        "ABX_DAEMON_SOCKET", "The shared daemon's unix socket.", default=DEFAULT_DAEMON_SOCKET)
    default_template: str = _var(
        "ABX_DEFAULT_TEMPLATE", "Template of `abx sandbox create`, and of the MCP server when "
        "ABX_MCP_TEMPLATE is unset.", config_key="default_template", default="base")

    # The engine.
    data_dir: Path = _var(
        "ABX_DATA_DIR", "The engine's state: images, sandboxes, database, gateway keys.",
        shown_default="`/var/lib/agent-sandbox` (root), else `$XDG_DATA_HOME/agent-sandbox`",
        default_factory=builtin_data_dir)
    pool_size: int = _var(
        "ABX_POOL_SIZE", "Warm (started, unclaimed) sandboxes kept per pooled template.",
        shown_default="0 (MCP servers: 2)", default=0, ge=0)
    pool_templates: CommaList = _var(
        "ABX_POOL_TEMPLATES", "Templates kept warm (comma list).",
        shown_default="`base` (MCP servers: their template)", default=("base",))
    shared_templates_dir: Path = _var(
        "ABX_SHARED_TEMPLATES_DIR", "Templates root builds once for every user of the host "
        "(`code-interpreter-v1`); used only while root owns it and nobody else may write it.",
        default=Path("/var/lib/agent-sandbox-templates"))
    template_index_url: str = _var(
        "ABX_TEMPLATE_INDEX_URL", "Package index `code-interpreter-v1` is built from (pip "
        "`--index-url`).", shown_default="pip's own (`PIP_INDEX_URL`, pip.conf), else PyPI",
        default="")
    build_network: str = _var(
        "ABX_BUILD_NETWORK", "Network policy of the sandboxes a recipe's RUN steps run in "
        "(`abx template build --file`): off, registries, open...", default="registries")
    build_max_layer_mb: int = _var(
        "ABX_BUILD_MAX_LAYER_MB", "Most a recipe step's layer (or a COPY's sources) may "
        "hold, in MiB.", default=4096, gt=0)
    network_open_ranges: CommaList = _var(
        "ABX_NETWORK_OPEN_RANGES", "Address ranges (CIDRs, comma list) sandboxes may reach "
        "although they are the host's, private or link-local: an operator's explicit choice "
        "(policies still apply).", default=())
    network_hosts: CommaList = _var(
        "ABX_NETWORK_HOSTS", "Names the sandbox policy resolver answers itself "
        "(`name=address`, comma list), before the host's resolver.", default=())
    criu: str = _var(
        "ABX_CRIU", "The CRIU binary memory snapshots use (>= 4.2); by default the one "
        "scripts/setup.sh builds into /var/cache/abx-criu, else a distro's.", default="",
        shown_default="the setup's build, else a distro's")
    secrets_upstream_ca: str = _var(
        "ABX_SECRETS_UPSTREAM_CA", "A PEM file of CAs the network proxy also trusts when it "
        "re-originates TLS to a secret's host (an internal service's own CA).", default="",
        shown_default="none: the host's trust store only")
    paused_stop_after: float = _var(
        "ABX_PAUSED_STOP_AFTER", "Seconds a sandbox stays paused before its container is "
        "stopped (disk kept; resuming boots it afresh).", default=900.0, ge=0)
    paused_max_age: float = _var(
        "ABX_PAUSED_MAX_AGE", "Seconds a paused sandbox is kept unused before it is ended "
        "(its volume kept or deleted as it asked at create: keep_volume); 0: kept until "
        "killed.", default=0.0, ge=0, shown_default="0 (kept until killed)")

    # The Kubernetes provider (ABX_ENGINE=kubernetes; docs/kubernetes.md).
    k8s_kubeconfig: str = _var("ABX_K8S_KUBECONFIG", "Kubeconfig of the cluster.", default="",
                               shown_default="`$KUBECONFIG`, `~/.kube/config`, else in-cluster")
    k8s_namespace: str = _var("ABX_K8S_NAMESPACE", "Namespace of the sandboxes' objects.",
                              shown_default="the pod's own in a cluster, else `default`",
                              default="")
    k8s_storage_class: str = _var("ABX_K8S_STORAGE_CLASS", "StorageClass of /workspace "
                                  "volumes.", shown_default="the cluster's default", default="")
    k8s_hostpath_dir: str = _var("ABX_K8S_HOSTPATH_DIR", "No volume provisioner (the test "
                                 "cluster): hostPath volumes under this directory.", default="")
    k8s_runtime_class: str = _var("ABX_K8S_RUNTIME_CLASS", "`runtimeClassName` of sandbox Pods "
                                  "(e.g. `gvisor`, `kata`).", default="")
    k8s_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = _var(
        "ABX_K8S_IMAGE_PULL_POLICY", "`imagePullPolicy` of sandbox Pods.", default="IfNotPresent")

    # The REST gateway.
    gateway_keys_file: Path | None = _var(
        "ABX_GATEWAY_KEYS_FILE", "The gateway's API key database.",
        shown_default="`$ABX_DATA_DIR/gateway-keys.db`", default=None)
    gateway_max_sandboxes: int = _var(
        "ABX_GATEWAY_MAX_SANDBOXES", "Default quota of a new key (and of each daemon user): "
        "live sandboxes at once.", default=50, ge=0)
    gateway_max_commands: int = _var(
        "ABX_GATEWAY_MAX_COMMANDS", "Default quota of a new key (and of each daemon user): "
        "commands running at once.", default=32, ge=0)
    gateway_network_ceiling: str = _var(
        "ABX_GATEWAY_NETWORK_CEILING", "The most network any sandbox of the gateway (and of "
        "the daemon) may have: `off`, a preset such as `registries`, a comma list of names, "
        "`*.` wildcards and CIDRs, or `full`; a key's own ceiling (`abx keys create "
        "--network`) can only lower it (docs/network.md).", default="full")
    gateway_public_ports: bool = _var(
        "ABX_GATEWAY_PUBLIC_PORTS", "Whether a key may make a port share link that needs no "
        "token (`expose_port(port, public=True)`; docs/ports.md).", default=False)
    gateway_preview_url: str = _var(
        "ABX_GATEWAY_PREVIEW_URL", "Scheme and wildcard domain of port previews "
        "(`https://preview.example.com`: share links become "
        "`https://PORT-SANDBOX.preview.example.com/...`, each its own browser origin; a "
        "wildcard DNS name and certificate in front, docs/ports.md).",
        shown_default="none: share links are paths of the gateway's own URL", default="")

    # The MCP server.
    mcp_template: str = _var(
        "ABX_MCP_TEMPLATE", "Template of the MCP server's sandboxes (a first `run_code` uses "
        "`code-interpreter-v1` when it has no kernel).",
        shown_default="ABX_DEFAULT_TEMPLATE via `abx mcp start`; else STDIO "
                      "`code-interpreter-v1`, HTTP `base`",
        config_key="mcp_template", default="")
    mcp_tools: str | None = _var(
        "ABX_MCP_TOOLS", "MCP tool allowlist (comma list of names, or `read-only`).",
        shown_default="every tool", config_key="mcp_tools", default=None)
    mcp_network_ceiling: str = _var(
        "ABX_MCP_NETWORK_CEILING", "The most network the model may give a sandbox through "
        "MCP (`create_sandbox`, `set_network`): `off`, `registries`, a comma list of names, "
        "`*.` wildcards and CIDRs, or `full` (docs/network.md).", default="registries")
    mcp_output_budget: int = _var(
        "ABX_MCP_OUTPUT_BUDGET", "Bytes of output an MCP tool call returns; the rest is saved "
        "in the sandbox.", default=100 * 1024, gt=0)
    mcp_max_concurrency: int = _var(
        "ABX_MCP_MAX_CONCURRENCY", "MCP tool calls at once before `busy` (with "
        "`retry_after`).", default=32, gt=0)
    mcp_session_concurrency: int = _var(
        "ABX_MCP_SESSION_CONCURRENCY", "MCP tool calls one HTTP session runs at once; its "
        "further calls wait their turn, so one client cannot take every slot.", default=8,
        gt=0)
    mcp_audit_log: Path | None = _var(
        "ABX_MCP_AUDIT_LOG", "The MCP server's JSON-lines audit log; empty: no audit log.",
        shown_default="`~/.abx/run/audit.log`",
        default_factory=lambda: _abx_run("audit.log"))
    mcp_auth_token: str | None = _var(
        "ABX_MCP_AUTH_TOKEN", "Bearer token of the MCP HTTP server; set but empty refuses "
        "every request.", secret=True, default=None)
    mcp_auth_token_file: str | None = _var(
        "ABX_MCP_AUTH_TOKEN_FILE", "File holding that token (an unreadable file refuses "
        "every request).", default=None)
    mcp_allowed_origins: CommaList = _var(
        "ABX_MCP_ALLOWED_ORIGINS", "Extra browser `Origin`s the MCP HTTP server accepts "
        "(comma list; `*` any).", shown_default="local origins only", default=())
    mcp_session_ttl: int = _var(
        "ABX_MCP_SESSION_TTL", "Seconds an idle MCP HTTP session lives.", default=3600, gt=0)
    mcp_max_sessions: int = _var(
        "ABX_MCP_MAX_SESSIONS", "MCP HTTP sessions at once.", default=100, gt=0)
    mcp_runtime_dir: Path = _var(
        "ABX_MCP_RUNTIME_DIR", "Where `abx mcp start` keeps its run record, log and "
        "generated token.", shown_default="`~/.abx/run`", default_factory=_abx_run)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = _var(
        "ABX_LOG_LEVEL", "Log level of the MCP servers (on stderr).", default="WARNING")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(describe(exc)) from None

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _EnvSource(settings_cls)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_kind(cls, value: Any) -> Any:
        kind = value.strip().lower() if isinstance(value, str) else value
        if kind not in ENGINES:
            raise ValueError(f"{value!r} is not one of embedded, rootless, daemon, remote, "
                             "kubernetes (or auto)")
        return kind

    @field_validator("sandbox_base_url", mode="before")
    @classmethod
    def _base_url(cls, value: Any) -> Any:
        return check_base_url(value) if isinstance(value, str) else value

    @field_validator("gateway_network_ceiling", "mcp_network_ceiling", mode="after")
    @classmethod
    def _network_policy(cls, value: str) -> str:
        from agent_sandbox.core.network import parse

        try:
            parse(value)
        except InvalidArgumentError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("pool_templates", "mcp_allowed_origins", "network_open_ranges",
                     "network_hosts", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("mcp_audit_log", mode="before")
    @classmethod
    def _blank_is_off(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def gateway_ceiling(self) -> NetworkPolicy:
        from agent_sandbox.core.network import parse

        return parse(self.gateway_network_ceiling)

    @property
    def mcp_ceiling(self) -> NetworkPolicy:
        from agent_sandbox.core.network import parse

        return parse(self.mcp_network_ceiling)

    @property
    def keys_file(self) -> Path:
        """The gateway's key database: ABX_GATEWAY_KEYS_FILE, else in the data dir."""
        return self.gateway_keys_file or self.data_dir / "gateway-keys.db"

    def to_env(self) -> dict[str, str | None]:
        """The variables set on this object (from the environment or by the code), as a
        child process's environment should carry them (None: leave the variable out)."""
        out: dict[str, str | None] = {}
        for name in self.model_fields_set:
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = ",".join(value)
            elif value is None and name == "mcp_audit_log":
                value = ""  # blank: off
            out[env_name(name)] = None if value is None else str(value)
        return out


def check_base_url(value: str) -> str:
    """A gateway URL (``http(s)://host[:port][/path]``), a daemon socket (``unix:///path``)
    or blank; anything else is refused with what it should look like."""
    from urllib.parse import urlsplit

    value = value.strip()
    if not value:
        return value
    example = ("like https://gateway.example.com, http://127.0.0.1:8080 or "
               "unix:///run/abx/abx.sock")
    if value.startswith("unix://"):
        if not value[len("unix://"):].startswith("/"):
            raise ValueError(f"a unix socket URL needs an absolute path, {example}")
        return value
    try:
        parts = urlsplit(value)
        port = parts.port  # raises on a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc}); use one {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s):// or unix:// URL; use one {example}")
    if port == 0 or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"give only scheme, host, port and path; use one {example}")
    return value


def check_value(field: str, value: str) -> None:
    """Check one setting's value alone (the rest of the environment is not read); a bad
    one raises ``SettingsError`` naming the variable."""
    try:
        Settings.model_validate({env_name(field): value})
    except ValidationError as exc:
        raise SettingsError(describe(exc)) from None


def env_name(field: str) -> str:
    """The environment variable of a ``Settings`` field."""
    alias = Settings.model_fields[field].alias
    assert alias is not None
    return alias


def child_env(settings: Settings, base: dict[str, str]) -> dict[str, str]:
    """A child process's environment: ``base`` (the rest of the parent's environment) with
    every variable of ``settings`` as the object has it, not as ``base`` had it."""
    names = {env_name(f) for f in Settings.model_fields}
    env = {k: v for k, v in base.items() if k not in names}
    env.update({k: v for k, v in settings.to_env().items() if v is not None})
    return env


def describe(exc: ValidationError) -> str:
    """One line per bad variable, naming it, what it needs and what it got."""
    lines = []
    for error in exc.errors(include_url=False):
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        got = error.get("input")
        shown = "" if isinstance(got, dict) else f", got {got!r}"
        msg = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"{name}: {msg}{shown}")
    return "invalid setting: " + "; ".join(lines)


def extra_of(field: str) -> dict[str, Any]:
    """The documentation marks of a field (``shown_default``, ``config_key``, ``secret``)."""
    extra = Settings.model_fields[field].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def shown_default(field: str) -> str:
    """A field's default as the docs say it."""
    shown = extra_of(field).get("shown_default")
    if isinstance(shown, str):
        return shown
    default = Settings.model_fields[field].get_default(call_default_factory=True)
    if isinstance(default, tuple):
        default = ",".join(default)
    return f"`{default}`" if default not in ("", None) else "unset"


_from_env: dict[tuple[object, ...], Settings] = {}


def from_environment() -> Settings:
    """``Settings()`` for the environment as it is now, the same (frozen) object while it
    is unchanged: building one costs about a millisecond, and the SDK asks on every
    create. Keyed by every variable a setting or a default reads, and the user."""
    key = (os.geteuid(), *sorted((k, v) for k, v in os.environ.items()
                                 if k.startswith(("ABX_", "SANDBOX_"))
                                 or k in ("XDG_DATA_HOME", "HOME")))
    found = _from_env.get(key)
    if found is None:
        found = Settings()
        if len(_from_env) >= 16:
            _from_env.clear()
        _from_env[key] = found
    return found
