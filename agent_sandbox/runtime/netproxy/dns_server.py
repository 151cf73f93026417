"""The sandbox's DNS server: for a name the policy allows (and that resolves), an A record
of the name's FAKE_RANGE address; NXDOMAIN at once (with an RFC 8914 "Blocked" extended
error naming the policy) for the rest."""

from __future__ import annotations

import asyncio
import socket

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from agent_sandbox.runtime.netproxy.fake import FakeAddresses
from agent_sandbox.runtime.netproxy.log import Log
from agent_sandbox.runtime.netproxy.resolver import TTL, Resolver

_MAX_PENDING = 256  # queries being answered at once; more are dropped (the client retries)


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
        if self._pending >= _MAX_PENDING or len(data) > 4096:
            return
        self._pending += 1
        task = asyncio.get_running_loop().create_task(self._answer(data, addr))
        task.add_done_callback(lambda _t: self._done())

    def _done(self) -> None:
        self._pending -= 1

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except (dns.exception.DNSException, ValueError, IndexError):
            return  # not a query we can even answer FORMERR to with its id
        try:
            reply = await self._reply(query)
            wire = reply.to_wire(max_size=512 if query.edns < 0 else 1232)
        except (dns.exception.DNSException, ValueError):
            reply = dns.message.make_response(query)
            reply.set_rcode(dns.rcode.SERVFAIL)
            wire = reply.to_wire()
        if self.transport is not None:
            self.transport.sendto(wire, addr)

    async def _reply(self, query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        reply.flags |= dns.flags.RA
        if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
            reply.set_rcode(dns.rcode.NOTIMP)
            return reply
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        policy = self.resolver.config.policy
        if not policy.allows_name(name):
            self.log.denied(f"DNS {name}: not allowed by network policy {policy.describe()}")
            reply.set_rcode(dns.rcode.NXDOMAIN)
            reply.use_edns(0, options=[dns.edns.EDEOption(
                dns.edns.EDECode.BLOCKED,
                f"{name} is not allowed by the sandbox network policy {policy.describe()}"[:200])])
            return reply
        if question.rdtype != dns.rdatatype.A or question.rdclass != dns.rdataclass.IN:
            return reply  # NOERROR, no data: the sandbox is IPv4 only
        if not await self.resolver.addresses(name):
            reply.set_rcode(dns.rcode.NXDOMAIN)
            return reply
        reply.answer.append(dns.rrset.from_text_list(
            question.name, int(TTL), "IN", "A", [self.fake.address_for(name)]))
        return reply


def serve(loop: asyncio.AbstractEventLoop, sock: socket.socket, resolver: Resolver,
          fake: FakeAddresses, log: Log) -> asyncio.Future:
    sock.setblocking(False)
    return asyncio.ensure_future(loop.create_datagram_endpoint(
        lambda: DnsServer(resolver, fake, log), sock=sock))
