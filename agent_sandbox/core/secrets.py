"""Secrets a sandbox may use but never sees: a name, a value kept on the host, and a rule
saying which hosts the value may be sent to and how. Inside the sandbox a program sees
only the placeholder ``abx-secret:NAME`` (in the environment variable the rule names);
the sandbox's egress proxy swaps it for the value on a request to an allowed host over a
TLS connection the proxy terminates (docs/secrets.md)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent_sandbox.core.errors import InvalidArgumentError

PLACEHOLDER_PREFIX = "abx-secret:"
NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
_HOST = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?"
                   r"(\.[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?)*(:[0-9]{1,5})?$")
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_QUERY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_VALUE = 8192
MIN_VALUE = 8
MAX_HOSTS = 16
MAX_SECRETS = 16  # per sandbox
DEFAULT_PORT = 443
# Headers a secret may not set: they decide where and how a request goes.
_RESERVED_HEADERS = {"host", "connection", "content-length", "transfer-encoding", "upgrade",
                     "te", "trailer", "proxy-authorization", "keep-alive"}


def placeholder(name: str) -> str:
    return PLACEHOLDER_PREFIX + name


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError(f"secret name {str(name)[:80]!r} is not one: give a "
                                   "lowercase letter then up to 62 of a-z, 0-9, _ and -")
    return name


def check_value(value: Any) -> str:
    """A value that can travel in a header or a query: printable ASCII (a CR/LF would
    make it two headers; other characters have more forms an echo of them could take
    than the proxy can blank out), at most MAX_VALUE characters."""
    if not isinstance(value, str) or len(value) < MIN_VALUE:
        raise InvalidArgumentError(f"a secret's value must be a string of at least {MIN_VALUE} "
                                   "characters (shorter ones could not be told apart from "
                                   "other text when an answer echoing one is blanked out)")
    if len(value) > MAX_VALUE:
        raise InvalidArgumentError(f"a secret's value is at most {MAX_VALUE} characters")
    if any(not " " <= c <= "~" for c in value):
        raise InvalidArgumentError("a secret's value is printable ASCII: no control "
                                   "characters (a newline at its end is stripped when read "
                                   "from a file) and no other characters")
    return value


def split_host(entry: str) -> tuple[str, int]:
    """``api.example.com`` or ``api.example.com:8443`` as (name, port)."""
    name, _, port = entry.partition(":")
    return name, int(port) if port else DEFAULT_PORT


class SecretRule(BaseModel):
    """Where a secret may go and how it is sent: a header (``header`` with ``format``,
    whose ``{}`` is the value; ``basic``: the value is ``user:password``, sent as HTTP
    basic auth), or a query parameter (``query``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="the secret's name")
    hosts: tuple[str, ...] = Field(description="host names (port 443 unless host:port) the "
                                               "value may be sent to")
    header: str | None = Field("Authorization", description="the header that carries it")
    format: str = Field("Bearer {}", description="the header's value; {} is the secret")
    basic: bool = Field(False, description="the value is user:password, sent as basic auth")
    query: str | None = Field(None, description="a query parameter that carries it instead")
    inject: bool = Field(False, description="set the header on every request to its hosts, "
                                            "whether or not the request carries the "
                                            "placeholder (E2B's network.rules transforms)")
    env: str = Field("", description="the environment variable holding the placeholder "
                                     "(default: NAME upper-cased, then _TOKEN)")

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise InvalidArgumentError("a secret rule is an object")
        data = dict(data)
        name = check_name(data.get("name"))
        hosts = data.get("hosts") or ()
        if isinstance(hosts, str):
            hosts = tuple(h for h in hosts.split(",") if h.strip())
        if not isinstance(hosts, list | tuple):
            raise InvalidArgumentError(f"secret {name}: hosts is a list of host names")
        if not hosts or len(hosts) > MAX_HOSTS:
            raise InvalidArgumentError(f"secret {name}: give 1 to {MAX_HOSTS} hosts it may "
                                       "be sent to (--host api.example.com)")
        clean = []
        for given in hosts:
            host = given.strip().lower().rstrip(".") if isinstance(given, str) else ""
            # A name whose last label is a number is an address (1.2.3.4, 127.1,
            # 2130706433), which resolvers and TLS read differently: never a secret's host.
            if not _HOST.match(host) or split_host(host)[0].rsplit(".", 1)[-1].isdigit() \
                    or not 0 < split_host(host)[1] < 65536:
                raise InvalidArgumentError(f"secret {name}: host {str(given)[:80]!r} is not a host "
                                           "name (a wildcard, URL or address is not taken)")
            clean.append(host)
        data["hosts"] = tuple(dict.fromkeys(clean))
        if data.get("query") is not None:
            if data.get("inject"):
                raise InvalidArgumentError(f"secret {name}: inject sets a header; a query "
                                           "parameter is put in only where the placeholder is")
            if not isinstance(data["query"], str) or not _QUERY.match(data["query"]):
                raise InvalidArgumentError(f"secret {name}: query parameter "
                                           f"{str(data['query'])[:64]!r} is not a plain name")
            data["header"] = None
        else:
            header = data.get("header", "Authorization") or "Authorization"
            if not isinstance(header, str) or not _HEADER.match(header) \
                    or header.lower() in _RESERVED_HEADERS:
                raise InvalidArgumentError(f"secret {name}: {str(header)[:64]!r} cannot carry "
                                           "a secret (give a header name such as "
                                           "Authorization or X-Api-Key)")
            data["header"] = header
        fmt = data.get("format")
        if fmt is None:
            fmt = "Basic {}" if data.get("basic") else ("{}" if data.get("query") is not None or
                                                       data["header"].lower() != "authorization"
                                                       else "Bearer {}")
        if not isinstance(fmt, str) or fmt.count("{}") != 1 or len(fmt) > 200 or any(
                ord(c) < 0x20 for c in fmt) or "{" in fmt.replace("{}", ""):
            raise InvalidArgumentError(f"secret {name}: format must hold {{}} once (where "
                                       "the value goes), e.g. 'Bearer {}'")
        data["format"] = fmt
        env = data.get("env") or re.sub(r"[^A-Z0-9_]", "_", name.upper()) + "_TOKEN"
        if not isinstance(env, str) or not _ENV.match(env):
            raise InvalidArgumentError(f"secret {name}: env {str(env)[:80]!r} is not a "
                                       "variable name")
        data["env"] = env
        return data

    @property
    def placeholder(self) -> str:
        return placeholder(self.name)

    def describe(self) -> str:
        how = (f"query parameter {self.query}" if self.query else
               f"header {self.header}" + (" (basic auth)" if self.basic else "") +
               (" (on every request)" if self.inject else ""))
        return f"secret {self.name} goes only to {', '.join(self.hosts)} as {how}"

    def header_transform_refused(self, host: str, header: str, fmt: str) -> str:
        """Why this rule cannot be E2B's transform "set ``header`` to ``fmt`` (its ``{}``
        the value) on every request to ``host``", or "" if it is exactly that: the
        stored rule decides where (its ports too) and how the value goes; a create can
        only name it."""
        names = set(self.hosts) | {split_host(h)[0] for h in self.hosts}
        if host.lower().rstrip(".") not in names:
            return f"{self.describe()}, not to {host}"
        if self.query or self.basic or (self.header or "").lower() != header.lower() \
                or self.format != fmt:
            return (f"{self.describe()} formatted {self.format!r}, not as header {header} "
                    f"{fmt.replace('{}', '${e2b.secrets.' + self.name + '}')!r}")
        if not self.inject:
            return (f"{self.describe()} only where the sandbox sends its placeholder; "
                    "E2B's transforms set the header on every request: store it with "
                    "inject (abx secrets create ... --inject)")
        return ""


class SecretInfo(SecretRule):
    """A stored secret as every API shows it: its rule, never its value."""

    created_at: float = 0.0


def check_names(value: Any) -> list[str]:
    """``create(secrets=[...])``: names of stored secrets, each once."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise InvalidArgumentError("secrets: give a list of secret names")
    names = [check_name(v.strip() if isinstance(v, str) else v) for v in value]
    if len(names) > MAX_SECRETS:
        raise InvalidArgumentError(f"secrets: at most {MAX_SECRETS} per sandbox")
    return list(dict.fromkeys(names))
