"""The proxy's configuration: a JSON file the engine writes (0600, in the host-only
sandbox directory) and the proxy re-reads on SIGHUP."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.netrules import Network, Policy, Rules, blocked_address

# Names resolve to addresses of this range (benchmarking, never routed), one per name: the
# sandbox never learns real addresses, and a connection's address says which name it is for.
FAKE_RANGE = "198.18.0.0/15"
GATEWAY = "10.255.255.1"  # the sandbox-side address of the proxy and resolver (on lo)
PROXY_PORT = 3128  # connections to GATEWAY:3128 are explicit proxy requests (CONNECT)
_MAX_CONFIG = 4 << 20
# Commands of a networked sandbox get these: proxy-aware tools (pip, npm, curl, requests)
# then ask the proxy by name, and a refusal comes back as an HTTP 403 naming the policy
# instead of a bare DNS failure their retries would repeat. Tools that ignore them are
# still caught by the transparent path.
_PROXY_URL = f"http://{GATEWAY}:{PROXY_PORT}"
PROXY_ENV = {"HTTP_PROXY": _PROXY_URL, "HTTPS_PROXY": _PROXY_URL, "http_proxy": _PROXY_URL,
             "https_proxy": _PROXY_URL, "NO_PROXY": "localhost,127.0.0.1,::1",
             "no_proxy": "localhost,127.0.0.1,::1"}
# The engine's setting (config/engine.py) that opens a blocked range: refusals name it.
OPEN_RANGES_SETTING = "ABX_NETWORK_OPEN_RANGES"


@dataclass(frozen=True)
class ProxyConfig:
    policy: Rules  # the engine's NetworkPolicy; a netrules.Policy once loaded (no pydantic)
    blocked: tuple[Network, ...] = ()
    open_ranges: tuple[Network, ...] = ()
    hosts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Secrets (values included) and, per secret host, the certificate and key the proxy
    # shows the sandbox there; CAs it trusts upstream besides the host's (PEM).
    secrets: tuple[dict[str, Any], ...] = ()
    leaves: dict[str, tuple[str, str]] = field(default_factory=dict)
    upstream_ca: str = ""

    def is_blocked(self, address: str) -> bool:
        """Never connect here: the host, private, link-local... unless the operator opened
        the range."""
        return blocked_address(address, self.open_ranges, self.blocked)

    def blocking_range(self, address: str) -> str:
        """Why ``address`` is blocked, for people: the narrowest blocked range holding it
        (the host's own address or network before the private range around it), else
        "not a global address"."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return "not an address"
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        holding = [n for n in self.blocked if ip in n]
        if not holding:
            return "not a global address"
        return f"in {max(holding, key=lambda n: n.prefixlen)}"

    def to_json(self) -> str:
        policy = self.policy
        return json.dumps({"policy": {"mode": policy.mode, "allow_out": list(policy.allow_out),
                                      "deny_out": list(policy.deny_out)},
                           "blocked": [str(n) for n in self.blocked],
                           "open_ranges": [str(n) for n in self.open_ranges],
                           "hosts": {k: list(v) for k, v in self.hosts.items()},
                           "secrets": list(self.secrets),
                           "leaves": {k: list(v) for k, v in self.leaves.items()},
                           "upstream_ca": self.upstream_ca})


def write(path: Path, config: ProxyConfig) -> None:
    """Rewrite the file in place (the proxy holds it open: it may no longer be allowed to
    open it once it has dropped privileges), 0600 from birth."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, config.to_json().encode(), 0)
    finally:
        os.close(fd)


def load(fd: int) -> ProxyConfig:
    """Read and check the file open at ``fd``; ValueError says what is wrong."""
    raw = b""
    while len(raw) < _MAX_CONFIG and (chunk := os.pread(fd, 65536, len(raw))):
        raw += chunk
    try:
        data = json.loads(raw)
    except ValueError as exc:  # also UnicodeDecodeError
        raise ValueError(f"the proxy config is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("the proxy config is not a JSON object")
    unknown = set(data) - {"policy", "blocked", "open_ranges", "hosts", "gateway", "proxy_port",
                           "secrets", "leaves", "upstream_ca"}
    if unknown:
        raise ValueError(f"the proxy config has unknown field(s) {sorted(unknown)[:5]}")
    if data.get("gateway", GATEWAY) != GATEWAY or data.get("proxy_port", PROXY_PORT) != PROXY_PORT:
        raise ValueError(f"the proxy serves {GATEWAY}, port {PROXY_PORT} for explicit "
                         "requests; the config asks for others")
    hosts = data.get("hosts", {})
    if not isinstance(hosts, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v)
            for k, v in hosts.items()):
        raise ValueError("the proxy config's hosts must map names to lists of addresses")
    for name, addresses in hosts.items():
        for a in addresses:
            _checked(ipaddress.ip_address, a, f"hosts[{name!r}]")
    try:
        policy = Policy.from_dump(data.get("policy", {}))
    except InvalidArgumentError as exc:
        raise ValueError(f"the proxy config's policy: {exc.message}") from None
    secrets, leaves = data.get("secrets", []), data.get("leaves", {})
    if not isinstance(secrets, list) or not all(isinstance(s, dict) for s in secrets) or \
            not isinstance(leaves, dict) or not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(p, str) for p in v)
                for v in leaves.values()) or not isinstance(data.get("upstream_ca", ""), str):
        raise ValueError("the proxy config's secrets, leaves or upstream_ca are malformed")
    return ProxyConfig(policy=policy, blocked=_networks(data, "blocked"),
                       open_ranges=_networks(data, "open_ranges"),
                       hosts={k.lower().rstrip("."): tuple(v) for k, v in hosts.items()},
                       secrets=tuple(secrets), leaves={k: (v[0], v[1]) for k, v in leaves.items()},
                       upstream_ca=data.get("upstream_ca", ""))


def _networks(data: dict, field: str) -> tuple[Network, ...]:
    value = data.get(field, [])
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise ValueError(f"the proxy config's {field} must be a list of CIDRs")
    return tuple(_checked(ipaddress.ip_network, n, field) for n in value)


def _checked(parse: Callable[[str], Any], text: str, field: str) -> Any:
    try:
        return parse(text)
    except ValueError:
        raise ValueError(f"the proxy config's {field}: {text[:60]!r} is not an address "
                         "or CIDR") from None
