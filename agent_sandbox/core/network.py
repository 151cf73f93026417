"""A sandbox's network policy: the one definition the SDK, MCP, REST, CLI and engine share.

Three modes:

- ``off`` (the default): loopback only; names do not resolve.
- ``allowlist``: only the names (exact, or ``*.`` wildcards: subdomains at any depth, not
  the name itself), CIDRs and presets in ``allow_out``, minus ``deny_out``.
- ``full``: any public address, minus ``deny_out``.

Whatever the mode, the host, private and link-local ranges and other sandboxes are never
reachable (the runtime enforces that apart from this policy; only an operator can open a
range). ``deny_out`` always wins over ``allow_out``.

Shorthands ``parse`` accepts: ``False``/``None``/``"off"``; ``True``/``"full"``; a preset
name (``"registries"``); a comma-separated or list of entries (an allowlist); a mapping
``{"mode"?, "allow_out": [...], "deny_out": [...]}`` (E2B's shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from agent_sandbox.core.errors import InvalidArgumentError, PermissionDeniedError
from agent_sandbox.core.netrules import (  # noqa: F401 - re-exported: netpolicy is the front door
    _HINT,
    MODES,
    PRESETS,
    Network,
    Rules,
    _cidr,
    _name,
    _shown,
    name_matches,
    normalise_entry,
)

Mode = Literal["off", "allowlist", "full"]
# Whatever ``parse`` takes: what create(network=...) and set_network(...) accept.
NetworkSpec = Any

def _overlap(base: str, denied: str) -> bool:
    """Does the wildcard ``*.base`` share any name with the deny entry ``denied``?"""
    if not denied.startswith("*."):
        return denied.endswith("." + base)
    other = denied[2:]
    return other == base or other.endswith("." + base) or base.endswith("." + other)


class NetworkPolicy(Rules, BaseModel):
    """What a sandbox may connect to. Build one with ``parse``; entries are canonical."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = "off"
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    # -- ceilings ------------------------------------------------------------------------
    def _denies_all_of(self, entry: str) -> bool:
        """Does this policy's own deny_out refuse everything ``entry`` (a canonical deny
        entry of a ceiling) names? Then the ceiling's deny asks nothing of it."""
        net = _cidr(entry)
        if net is not None:
            return any(net.version == d.version and net.subnet_of(d)
                       for d in self._nets(self.deny_out))
        names = self._names(self.deny_out)
        if not entry.startswith("*."):
            return any(name_matches(entry, d) for d in names)
        base = entry[2:]
        return any(d.startswith("*.") and (base == d[2:] or base.endswith(d[1:]))
                   for d in names)

    def _covers(self, entry: str, asker: NetworkPolicy) -> bool:
        """Does this policy (a ceiling) allow everything ``entry`` (canonical, not a preset)
        of ``asker``'s allow_out allows, apart from what ``asker`` denies itself?"""
        if self.mode == "off":
            return False
        net = _cidr(entry)
        open_denied = [d for d in self.expanded(self.deny_out) if not asker._denies_all_of(d)]
        if net is not None:
            denied = [n for n in map(_cidr, open_denied) if n is not None]
            if any(net.overlaps(d) for d in denied):
                return False
            return self.mode == "full" or any(net.version == n.version and net.subnet_of(n)
                                              for n in self._nets(self.allow_out))
        denied_names = [d for d in open_denied if _cidr(d) is None]
        if not entry.startswith("*."):
            if any(name_matches(entry, d) for d in denied_names):
                return False
            return self.mode == "full" or any(name_matches(entry, a)
                                              for a in self._names(self.allow_out))
        base = entry[2:]
        if any(_overlap(base, d) for d in denied_names):
            return False
        return self.mode == "full" or any(
            a.startswith("*.") and (base == a[2:] or base.endswith(a[1:]))
            for a in self._names(self.allow_out))

    def excess(self, ceiling: NetworkPolicy) -> list[str]:
        """What this policy allows beyond ``ceiling``: the allow entries (presets
        expanded) it does not cover, ``["full"]`` for full mode, or the ceiling's deny
        entries a full policy leaves open. Empty: the policy is within the ceiling."""
        if self.mode == "off":
            return []
        if self.mode == "full":
            if ceiling.mode != "full":
                return ["full"]
            return [f"{d} (denied by the ceiling)" for d in ceiling.expanded(ceiling.deny_out)
                    if not self._denies_all_of(d)]
        return [e for e in self.expanded(self.allow_out) if not ceiling._covers(e, self)]

    def within(self, ceiling: NetworkPolicy) -> bool:
        """Is everything this policy allows also allowed by ``ceiling``?"""
        return not self.excess(ceiling)

    def check_within(self, ceiling: NetworkPolicy, who: str, how_to_raise: str = "") -> None:
        """Refuse (PermissionDeniedError: 403 on the gateway) a policy that asks for more
        than ``ceiling``, set by ``who`` ("this MCP server's operator", "API key 'ci'");
        ``how_to_raise`` tells the reader how that ceiling is changed."""
        beyond = self.excess(ceiling)
        if not beyond:
            return
        shown = ", ".join(beyond[:5]) + (f" and {len(beyond) - 5} more" if len(beyond) > 5
                                         else "")
        raise PermissionDeniedError(
            f"network {self.describe()} is more than {who} allows: the network ceiling is "
            f"{ceiling.describe()}, and {shown} is beyond it. Ask for at most the ceiling"
            + (f"; {how_to_raise}" if how_to_raise else "; only the operator can raise it"),
            details={"ceiling": ceiling.model_dump(mode="json"), "beyond": beyond[:20]})


def compact(policy: NetworkPolicy) -> bool | dict[str, Any]:
    """The policy in its shortest spelling: False (off) or True (full) where that says it
    all, else its fields as JSON. An engine or gateway from before policies takes the
    first two; every ``parse`` takes all three."""
    if not policy.deny_out and policy.mode in ("off", "full"):
        return policy.mode == "full"
    return policy.model_dump(mode="json")


def _entries(value: object, field: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise InvalidArgumentError(f"network {field} must be a list of entries; {_HINT}")
    if len(value) > 256:
        raise InvalidArgumentError(f"network {field} has {len(value)} entries; at most 256")
    return tuple(dict.fromkeys(normalise_entry(v) for v in value))


def _from_mapping(value: Mapping[str, Any]) -> NetworkPolicy:
    unknown = set(value) - {"mode", "allow_out", "deny_out"}
    if unknown:
        raise InvalidArgumentError(f"network policy has unknown field(s) "
                                   f"{_shown(sorted(map(str, unknown)))}; "
                                   "it takes mode, allow_out and deny_out")
    allow = _entries(value.get("allow_out") or [], "allow_out")
    deny = _entries(value.get("deny_out") or [], "deny_out")
    mode = value.get("mode")
    if isinstance(mode, str):
        mode = mode.strip().lower()
    if mode is None:
        mode = "allowlist" if allow else ("full" if deny else "off")
    if mode not in MODES:
        raise InvalidArgumentError(f"network mode {_shown(mode)} is not one of {', '.join(MODES)}")
    if mode == "off" and (allow or deny):
        raise InvalidArgumentError("network mode 'off' takes no allow_out or deny_out")
    if mode == "full" and allow:
        raise InvalidArgumentError("network mode 'full' allows everything public already; "
                                   "give allow_out with mode 'allowlist' (or deny_out only)")
    if mode == "allowlist" and not allow:
        raise InvalidArgumentError("network mode 'allowlist' needs at least one allow_out "
                                   f"entry; {_HINT}")
    try:
        return NetworkPolicy(mode=mode, allow_out=allow, deny_out=deny)
    except ValidationError as exc:  # unreachable with the checks above; never a traceback
        raise InvalidArgumentError(f"network policy is not valid: {exc}") from None


def parse(value: object) -> NetworkPolicy:
    """Any accepted spelling of a policy (see the module doc) as a NetworkPolicy."""
    if isinstance(value, NetworkPolicy):
        return value
    if value is None or value is False:
        return NetworkPolicy()
    if value is True:
        return NetworkPolicy(mode="full")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("off", "none", ""):
            return NetworkPolicy()
        if text in ("full", "on"):
            return NetworkPolicy(mode="full")
        if text == "allowlist":
            raise InvalidArgumentError(f"network 'allowlist' needs its entries: {_HINT}")
        if not text.replace(",", "").strip():
            raise InvalidArgumentError(f"network {_shown(value)} names no entry: give off, full, "
                                       f"a preset or entries; {_HINT}")
        return _from_mapping({"allow_out": value})
    if isinstance(value, list | tuple):
        return _from_mapping({"allow_out": list(value)})
    if isinstance(value, Mapping):
        return _from_mapping(value)
    raise InvalidArgumentError(
        f"network {_shown(value)} is not understood: give off, full, a preset "
        f"({', '.join(PRESETS)}), a list of entries, or {{'allow_out': [...], "
        "'deny_out': [...]}")
