"""What a network policy allows, without pydantic: the entry grammar and the matching.

``netpolicy.NetworkPolicy`` (the pydantic model every surface uses) takes its reading
methods from ``Rules`` here, so there is one definition; the per-sandbox proxy
(backends/runc/netproxy), one process per networked sandbox, uses ``Policy`` and does not pay
for importing pydantic (about 9 MiB of its ~35 MiB).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError

# Never reachable from a sandbox, whatever its policy (only an operator opens a range):
# never the internet: "this network", private, carrier-grade NAT, loopback, link-local
# (cloud metadata), IETF protocol assignments, documentation, benchmarking, multicast,
# reserved and broadcast.
BLOCKED_V4 = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
)
# Unspecified, loopback, IPv4-mapped, unique local, link-local, multicast.
BLOCKED_V6 = ("::/128", "::1/128", "::ffff:0:0/96", "fc00::/7", "fe80::/10", "ff00::/8")

MODES: tuple[str, ...] = ("off", "allowlist", "full")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
BLOCKED_NETWORKS: tuple[Network, ...] = tuple(ipaddress.ip_network(r)
                                               for r in (*BLOCKED_V4, *BLOCKED_V6))


def blocked_address(address: str, open_ranges: Iterable[Network] = (),
                    blocked: Iterable[Network] = BLOCKED_NETWORKS) -> bool:
    """Is ``address`` one no policy reaches (not global, or in ``blocked``) and no range
    the operator opened (ABX_NETWORK_OPEN_RANGES) holds? Not an address: blocked.
    IPv4-mapped IPv6 is judged as the IPv4 address it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in n for n in open_ranges):
        return False
    return not ip.is_global or any(ip in n for n in blocked)  # `in` is False across versions

# What each package manager's installer really downloads from.
PRESETS: dict[str, tuple[str, ...]] = {
    "registries": (
        "pypi.org", "files.pythonhosted.org",  # pip, uv
        "registry.npmjs.org", "registry.yarnpkg.com",  # npm, yarn, pnpm
        "deb.debian.org", "security.debian.org", "cdn-fastly.deb.debian.org",  # apt (Debian)
        "archive.ubuntu.com", "*.archive.ubuntu.com", "security.ubuntu.com",  # apt (Ubuntu)
        "ports.ubuntu.com",
    ),
}

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_HINT = ("an entry is a host name (pypi.org), a wildcard (*.example.com), an address or "
         f"CIDR (203.0.113.7, 198.51.100.0/24) or a preset ({', '.join(PRESETS)})")


def _name(text: str) -> str | None:
    """``text`` as a normalised host name, or None if it is not one."""
    name = text.strip().lower().rstrip(".")
    if not name or len(name) > 253 or "." not in name:
        return None
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        return None
    return name


@functools.lru_cache(maxsize=4096)
def _cidr(text: str) -> Network | None:
    # Cached: a policy's entries are classified on every decision the proxy makes, and a
    # failed ip_network() (every name) costs an exception: 4 ms for 200 entries uncached.
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None


def _shown(value: object) -> str:
    """A value for an error message, capped: a huge entry never comes back whole."""
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + f"... ({len(text)} characters)"


def normalise_entry(entry: object) -> str:
    """One allow/deny entry in its canonical spelling; a clear error otherwise."""
    if not isinstance(entry, str) or not entry.strip():
        raise InvalidArgumentError(f"network entry {_shown(entry)} is not a non-empty "
                                   f"string; {_HINT}")
    text = entry.strip().lower()
    if text in PRESETS:
        return text
    if text.startswith("*."):
        name = _name(text[2:])
        if name is None:
            raise InvalidArgumentError(f"network entry {_shown(entry)}: the wildcard must be '*.' "
                                       f"before a host name; {_HINT}")
        return f"*.{name}"
    net = _cidr(text)
    if net is not None:
        return str(net)
    name = _name(text)
    if name is None:
        raise InvalidArgumentError(f"network entry {_shown(entry)} is not understood; "
                                   f"{_HINT}")
    return name


def name_matches(name: str, entry: str) -> bool:
    """Does host ``name`` (normalised) match the name or wildcard ``entry``?"""
    if entry.startswith("*."):
        return name.endswith(entry[1:])
    return name == entry



class Rules:
    """The reading half of a policy; the class mixing it in has ``mode``, ``allow_out``
    and ``deny_out`` (canonical entries)."""

    __slots__ = ()
    mode: str
    allow_out: tuple[str, ...]
    deny_out: tuple[str, ...]

    # -- reading -------------------------------------------------------------------------
    def expanded(self, entries: Iterable[str]) -> list[str]:
        """Entries with presets replaced by what they name."""
        out: list[str] = []
        for entry in entries:
            out.extend(PRESETS.get(entry, (entry,)))
        return out

    def _names(self, entries: Iterable[str]) -> list[str]:
        return [e for e in self.expanded(entries) if _cidr(e) is None]

    def _nets(self, entries: Iterable[str]) -> list[Network]:
        return [n for n in map(_cidr, self.expanded(entries)) if n is not None]

    def allows_name(self, name: str) -> bool:
        """May the sandbox resolve and connect to host ``name``?"""
        host = _name(name)
        if host is None or self.mode == "off":
            return False
        if any(name_matches(host, e) for e in self._names(self.deny_out)):
            return False
        return self.mode == "full" or any(name_matches(host, e)
                                          for e in self._names(self.allow_out))

    def allows_address(self, address: str) -> bool:
        """May the sandbox connect to ``address`` by number (no name involved)? The
        runtime's always-blocked ranges are checked apart from this."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if self.mode == "off" or any(ip in n for n in self._nets(self.deny_out)):
            return False
        return self.mode == "full" or any(ip in n for n in self._nets(self.allow_out))

    def describe(self) -> str:
        """For people: ``allowlist (pypi.org, registries)``, ``full``, ``off``."""
        text = self.mode
        if self.allow_out:
            text += f" ({', '.join(self.allow_out)})"
        if self.deny_out:
            text += f" except ({', '.join(self.deny_out)})"
        return text


@dataclass(frozen=True)
class Policy(Rules):
    """A policy as the proxy holds it (no pydantic): built from ``NetworkPolicy``'s
    ``model_dump()`` by ``from_dump``, which checks it as strictly."""

    mode: str = "off"
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    @classmethod
    def from_dump(cls, data: Mapping[str, Any]) -> Policy:
        """``data`` must be a canonical dump (entries as ``normalise_entry`` spells them);
        InvalidArgumentError says what is not."""
        if not isinstance(data, Mapping) or set(data) - {"mode", "allow_out", "deny_out"}:
            raise InvalidArgumentError("a network policy is an object with mode, allow_out "
                                       "and deny_out")
        mode = data.get("mode", "off")
        if mode not in MODES:
            raise InvalidArgumentError(f"network mode {_shown(mode)} is not one of "
                                       f"{', '.join(MODES)}")
        lists: list[tuple[str, ...]] = []
        for field in ("allow_out", "deny_out"):
            entries = data.get(field) or []
            if not isinstance(entries, list | tuple) or len(entries) > 256:
                raise InvalidArgumentError(f"network {field} must be a list of at most 256 "
                                           "entries")
            for entry in entries:
                if normalise_entry(entry) != entry:
                    raise InvalidArgumentError(f"network {field} entry {_shown(entry)} is not "
                                               "in its canonical spelling")
            lists.append(tuple(entries))
        return cls(mode=mode, allow_out=lists[0], deny_out=lists[1])
