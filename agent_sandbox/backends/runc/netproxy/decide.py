"""The policy decision for one TCP connection: where it was going (SO_ORIGINAL_DST: a
name's FAKE_RANGE address, or an address of the allowlist's CIDRs / of anywhere for
``full``) and which name its first bytes ask for (SNI / Host). A name's address used with
another SNI/Host is refused (no domain fronting); the address finally connected to is
never one of the always-blocked ranges unless the operator opened it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from agent_sandbox.backends.runc.netproxy.fake import FakeAddresses, is_fake
from agent_sandbox.backends.runc.netproxy.peek import Hello
from agent_sandbox.backends.runc.netproxy.resolver import Resolver
from agent_sandbox.core.netrules import Policy, Rules


@dataclass(frozen=True)
class Decision:
    allowed: bool
    why: str = ""
    upstream: tuple[str, ...] = ()  # the real addresses to connect to, in order
    logged: str = ""  # what the host's log says, when it says more than ``why``

    @property
    def log_text(self) -> str:
        return self.logged or self.why


def _denied_by_name(policy: Rules, name: str) -> bool:
    return not Policy(mode="full", deny_out=policy.deny_out).allows_name(name)


async def decide_name(resolver: Resolver, name: str) -> Decision:
    policy = resolver.config.policy
    if not policy.allows_name(name):
        return Decision(False, f"{name} is not allowed by network policy {policy.describe()}")
    found = await resolver.resolve(name)
    if not found.reachable:
        return Decision(False, found.why_not(name, detail=policy.mode != "full"),
                        logged=found.why_not(name))
    return Decision(True, upstream=found.reachable)


async def decide(resolver: Resolver, fake: FakeAddresses, address: str,
                 name: str | None) -> Decision:
    """May the sandbox reach ``address`` (for ``name``, if its first bytes named one)?"""
    policy = resolver.config.policy
    if is_fake(address):
        target = fake.name_of(address)
        if target is None:
            return Decision(False, f"{address} stands for no name any more (look it up again)")
        if name is not None and name != target:
            return Decision(False, f"a connection to {target} may not ask for {name}")
        return await decide_name(resolver, target)
    if name is not None and is_address(name):  # "Host: 93.184.216.34"
        if name != address:
            return Decision(False, f"a connection to {address} may not ask for {name}")
        name = None
    if name is not None and _denied_by_name(policy, name):
        return Decision(False, f"{name} is denied by network policy {policy.describe()}")
    if resolver.config.is_blocked(address):
        return Decision(False, f"{address} is the host, a private or a link-local address, "
                               "which a sandbox never reaches")
    if policy.allows_address(address):
        return Decision(True, upstream=(address,))
    return Decision(False, f"{address} was reached by number, not by an allowed name "
                           f"(network policy {policy.describe()})")


def unreadable(hello: Hello) -> str:
    """Why the first bytes are refused before any policy is asked ("": they are not): an
    HTTP request whose host cannot be read one way, or first bytes that never finished
    (what the proxy did not see could name another host)."""
    if hello.kind == "http" and hello.name is None:
        return ("the HTTP request does not name its host one way (one Host header, CRLF "
                "line ends, an absolute-form target only for that host)")
    if hello.kind == "incomplete":
        return "its first bytes (a TLS ClientHello or an HTTP head) did not finish in time"
    return ""


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
