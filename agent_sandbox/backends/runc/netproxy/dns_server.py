"""The sandbox's DNS server: for a name the policy allows (and that resolves), an A record
of the name's FAKE_RANGE address; NXDOMAIN at once for the rest, with an RFC 8914
"Blocked" extended error naming the policy, or the blocked addresses an allowed name
resolves to (and the operator setting that opens them)."""

from __future__ import annotations

import asyncio
import socket

import dns.edns
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from agent_sandbox.backends.runc.netproxy.fake import FakeAddresses
from agent_sandbox.backends.runc.netproxy.log import Log
from agent_sandbox.backends.runc.netproxy.resolver import TTL, Found, Resolver

_MAX_PENDING = 256  # queries being answered at once; more are dropped (the client retries)
_MAX_EDE_TEXT = 400  # characters of an extended error's text (a reply stays under 1232 bytes)


class DnsServer(asyncio.DatagramProtocol):
    def __init__(self, resolver: Resolver, fake: FakeAddresses, log: Log) -> None:
        self.resolver = resolver
        self.fake = fake
        self.log = log
        self.transport: asyncio.DatagramTransport | None = None
        self._pending = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        """Parse and answer what needs no lookup here and now (garbage costs nothing
        queued); only an allowed name's lookup becomes a task, a bounded number of them."""
        if len(data) > 4096:
            return
        try:
            query = dns.message.from_wire(data)
        except Exception:  # noqa: BLE001 - dnspython raises many kinds on garbage
            return
        try:
            reply, name = self._immediate(query)
        except Exception:  # noqa: BLE001 - never let one packet stop the resolver
            return
        if reply is not None:
            self._send(query, reply, addr)
        elif self._pending < _MAX_PENDING:
            self._pending += 1
            task = asyncio.get_running_loop().create_task(self._lookup(query, name, addr))
            task.add_done_callback(lambda _t: self._done())

    def _done(self) -> None:
        self._pending -= 1

    def _send(self, query: dns.message.Message, reply: dns.message.Message,
              addr: tuple[str, int]) -> None:
        try:
            wire = reply.to_wire(max_size=512 if query.edns < 0 else 1232)
        except Exception:  # noqa: BLE001
            reply = dns.message.make_response(query)
            reply.set_rcode(dns.rcode.SERVFAIL)
            wire = reply.to_wire()
        if self.transport is not None:
            self.transport.sendto(wire, addr)

    def _immediate(self, query: dns.message.Message) -> tuple[dns.message.Message | None, str]:
        """The reply if it needs no lookup, else (None, the name to look up)."""
        reply = dns.message.make_response(query)
        reply.flags |= dns.flags.RA
        if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
            reply.set_rcode(dns.rcode.NOTIMP)
            return reply, ""
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        policy = self.resolver.config.policy
        if not policy.allows_name(name):
            self.log.denied(f"DNS {name}: not allowed by network policy {policy.describe()}")
            reply.set_rcode(dns.rcode.NXDOMAIN)
            reply.use_edns(0, options=[dns.edns.EDEOption(
                dns.edns.EDECode.BLOCKED,
                f"{name} is not allowed by the sandbox network policy {policy.describe()}"[:200])])
            return reply, ""
        if question.rdtype != dns.rdatatype.A or question.rdclass != dns.rdataclass.IN:
            return reply, ""  # NOERROR, no data: the sandbox is IPv4 only
        return None, name

    async def _lookup(self, query: dns.message.Message, name: str,
                      addr: tuple[str, int]) -> None:
        """An allowed name's answer: its stand-in address if it resolves to one a sandbox
        may reach; else NXDOMAIN (SERVFAIL if the host's lookup failed), with an extended
        error saying why when there is more to say than "no such name"."""
        reply = dns.message.make_response(query)
        reply.flags |= dns.flags.RA
        try:
            found = await self.resolver.resolve(name)
        except Exception as exc:  # noqa: BLE001 - the sandbox still gets an answer
            found = Found(error=f"{type(exc).__name__}: {exc}"[:200])
        if found.reachable:
            reply.answer.append(dns.rrset.from_text_list(
                query.question[0].name, int(TTL), "IN", "A", [self.fake.address_for(name)]))
        else:
            reply.set_rcode(dns.rcode.SERVFAIL if found.error else dns.rcode.NXDOMAIN)
            if found.error or found.blocked:
                detail = self.resolver.config.policy.mode != "full"
                self.log.denied(f"DNS {name}: {found.why_not(name)}")
                reply.use_edns(0, options=[dns.edns.EDEOption(
                    dns.edns.EDECode.BLOCKED if found.blocked else dns.edns.EDECode.OTHER,
                    found.why_not(name, detail=detail)[:_ede_room(query)])])
        self._send(query, reply, addr)


def _ede_room(query: dns.message.Message) -> int:
    """Characters of extended-error text a reply has room for: a query without EDNS gets
    512 bytes, which a 255-byte name and 200 characters still fit."""
    return _MAX_EDE_TEXT if query.edns >= 0 else 200


def warm_up() -> None:
    """Build and encode every kind of reply once (dnspython imports rdata types lazily)."""
    query = dns.message.make_query("warm.up", "A", use_edns=0)
    reply = dns.message.make_response(query)
    reply.use_edns(0, options=[dns.edns.EDEOption(dns.edns.EDECode.BLOCKED, "x")])
    reply.answer.append(dns.rrset.from_text_list(query.question[0].name, 1, "IN", "A",
                                                 ["198.18.0.1"]))
    dns.message.from_wire(reply.to_wire())
    dns.message.from_wire(dns.message.make_query("warm.up", "AAAA").to_wire())


def serve(loop: asyncio.AbstractEventLoop, sock: socket.socket, resolver: Resolver,
          fake: FakeAddresses, log: Log) -> asyncio.Future:
    sock.setblocking(False)
    return asyncio.ensure_future(loop.create_datagram_endpoint(
        lambda: DnsServer(resolver, fake, log), sock=sock))
