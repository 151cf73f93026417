"""The policy proxy's parts in-process (no root, no sandbox): what first bytes name, the
stand-in addresses, the decision table, the DNS answers, the config and the nft rules."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import ssl
from pathlib import Path
from typing import Any

import dns.edns
import dns.message
import dns.rcode
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_sandbox.backends.runc.netproxy import config as proxy_config
from agent_sandbox.backends.runc.netproxy import namespace as netns
from agent_sandbox.backends.runc.netproxy.decide import decide
from agent_sandbox.backends.runc.netproxy.dns_server import DnsServer
from agent_sandbox.backends.runc.netproxy.fake import FakeAddresses, is_fake
from agent_sandbox.backends.runc.netproxy.log import Log
from agent_sandbox.backends.runc.netproxy.peek import inspect
from agent_sandbox.backends.runc.netproxy.resolver import Found, Resolver
from agent_sandbox.core.network import parse

PUBLIC = "93.184.216.34"
DOC = "203.0.113.80"  # TEST-NET-3: what this test host's own resolver gives the registries


def _client_hello(name: str) -> bytes:
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_first_bytes_name_the_host() -> None:
    hello = _client_hello("PyPI.org")
    assert inspect(hello).name == "pypi.org" and inspect(hello).kind == "tls"
    assert inspect(hello[:60]).kind == "partial"
    assert inspect(b"GET / HTTP/1.1\r\nHost: Example.COM:8080\r\n\r\n").name == "example.com"
    two = b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"
    assert inspect(two).kind == "http" and inspect(two).name is None  # ambiguous: no name
    assert inspect(b"GET / HTTP/1.1\r\nHost: a.te").kind == "partial"
    assert inspect(b"SSH-2.0-OpenSSH\r\n").kind == "other"
    assert inspect(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n").name is None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 600), st.booleans())
def test_any_bytes_never_raise(data: bytes, cut: int, tls: bool) -> None:
    inspect((b"\x16\x03\x01" if tls else b"") + data)
    hello = bytearray(_HELLO)
    if data:
        hello[cut % len(hello)] = data[0]
    inspect(bytes(hello[:cut + 5]))


_HELLO = _client_hello("a.test")


def test_stand_in_addresses_are_stable_and_distinct() -> None:
    fake, other = FakeAddresses(), FakeAddresses()
    a, b = fake.address_for("a.test"), fake.address_for("b.test")
    assert a != b and is_fake(a) and not is_fake(PUBLIC)
    assert fake.address_for("a.test") == a == other.address_for("a.test")
    assert fake.name_of(a) == "a.test" and fake.name_of("198.18.0.9") is None


def _resolver(policy: Any, **kw: Any) -> Resolver:
    blocked = tuple(netns.blocked_networks()) if kw.pop("host", False) else ()
    return Resolver(proxy_config.ProxyConfig(
        policy=parse(policy), blocked=blocked,
        hosts={"a.test": (PUBLIC,), "inner.test": ("10.1.2.3",), "local.test": ("127.0.0.2",),
               "doc.test": (DOC,)},
        **kw))


def _decide(resolver: Resolver, fake: FakeAddresses, address: str,
            name: str | None = None) -> tuple[bool, str, tuple[str, ...]]:
    d = asyncio.run(decide(resolver, fake, address, name))
    return d.allowed, d.why, d.upstream


def test_the_decision_table() -> None:
    fake = FakeAddresses()
    listed = _resolver(["a.test", "inner.test", "198.51.100.0/24"])
    a = fake.address_for("a.test")
    assert _decide(listed, fake, a) == (True, "", (PUBLIC,))
    assert _decide(listed, fake, a, "a.test")[0]
    allowed, why, _ = _decide(listed, fake, a, "evil.test")
    assert not allowed and "may not ask for evil.test" in why  # no fronting
    allowed, why, _ = _decide(listed, fake, fake.address_for("evil.test"))
    assert not allowed and "not allowed by network policy allowlist" in why
    assert not _decide(listed, fake, "198.18.0.200")[0]  # stands for no name
    allowed, why, _ = _decide(listed, fake, fake.address_for("inner.test"))
    assert not allowed and "resolves only to 10.1.2.3 (not a global address)" in why
    allowed, why, _ = _decide(listed, fake, "10.0.0.1")
    assert not allowed and "never reaches" in why
    allowed, why, _ = _decide(listed, fake, PUBLIC)
    assert not allowed and "by number" in why
    assert _decide(listed, fake, "198.51.100.7") == (False, _decide(listed, fake,
                                                                     "198.51.100.7")[1], ())
    full = _resolver({"deny_out": ["bad.test"]})
    assert _decide(full, fake, PUBLIC) == (True, "", (PUBLIC,))
    assert not _decide(full, fake, PUBLIC, "bad.test")[0]
    assert not _decide(full, fake, "169.254.169.254")[0]
    assert not _decide(full, fake, "::ffff:10.0.0.1")[0]
    opened = _resolver(["local.test"], open_ranges=(ipaddress.ip_network("127.0.0.2/32"),))
    assert _decide(opened, fake, fake.address_for("local.test"))[2] == ("127.0.0.2",)
    closed = _resolver(["local.test"])
    assert not _decide(closed, fake, fake.address_for("local.test"))[0]


def test_a_cidr_entry_reaches_public_addresses_in_it() -> None:
    fake = FakeAddresses()
    listed = _resolver(["93.184.216.0/24"])
    assert _decide(listed, fake, PUBLIC) == (True, "", (PUBLIC,))


class _Transport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append(data)


def _ask(server: DnsServer, wire: bytes) -> dns.message.Message | None:
    transport = _Transport()
    server.transport = transport  # type: ignore[assignment]

    async def go() -> None:
        server.datagram_received(wire, ("10.255.255.1", 5353))
        await asyncio.sleep(0.05)

    asyncio.run(go())
    return dns.message.from_wire(transport.sent[0]) if transport.sent else None


def test_dns_answers() -> None:
    fake = FakeAddresses()
    server = DnsServer(_resolver(["a.test"]), fake, Log())
    reply = _ask(server, dns.message.make_query("a.test", "A").to_wire())
    assert reply is not None and reply.rcode() == dns.rcode.NOERROR
    assert [r.address for r in reply.answer[0]] == [fake.address_for("a.test")]
    reply = _ask(server, dns.message.make_query("evil.test", "A", use_edns=0).to_wire())
    assert reply is not None and reply.rcode() == dns.rcode.NXDOMAIN
    ede = [o for o in reply.options if isinstance(o, dns.edns.EDEOption)]
    assert ede and ede[0].code == dns.edns.EDECode.BLOCKED and "allowlist" in (ede[0].text or "")
    reply = _ask(server, dns.message.make_query("a.test", "AAAA").to_wire())
    assert reply is not None and reply.rcode() == dns.rcode.NOERROR and not reply.answer
    for garbage in (b"", os.urandom(40), b"\x00" * 12, b"\xff" * 600):
        reply = _ask(server, garbage)  # dropped, or refused: never an answer, never a raise
        assert reply is None or (not reply.answer and reply.rcode() == dns.rcode.NOTIMP)


def test_config_round_trip_and_refusals(tmp_path: Path) -> None:
    path = tmp_path / "netproxy.json"
    conf = proxy_config.ProxyConfig(policy=parse("registries"), hosts={"a.test": (PUBLIC,)})
    proxy_config.write(path, conf)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    fd = os.open(path, os.O_RDONLY)
    try:
        loaded = proxy_config.load(fd)
        assert loaded.to_json() == conf.to_json() and "pydantic" not in repr(type(loaded.policy))
        for bad in ('[1]', '{"hosts": {"a": "1.2.3.4"}}', '{"hosts": {"a": ["nope"]}}',
                    '{"policy": {"mode": "sideways"}}', '{"policy": {"allow_out": ["PyPI.org"]}}',
                    '{"policy": {"mode": "full", "extra": 1}}', '{"policy": []}',
                    '{"blocked": [5]}', '{"blocked": ["10.0.0.0/33"]}', '{"open_ranges": {}}',
                    '{"hostz": {}}', '\xff', '{"blocked": ["10.0.0.1/8"]}'):
            path.write_text(bad)
            with pytest.raises(ValueError, match="the proxy config"):
                proxy_config.load(fd)
    finally:
        os.close(fd)


def test_the_rules_follow_the_policy() -> None:
    blocked = [ipaddress.ip_network("10.0.0.0/8")]
    listed = netns.ruleset(1, 2, parse("a.test,198.51.100.0/24"), blocked, [])
    assert "ip daddr { 198.18.0.0/15, 198.51.100.0/24 } meta l4proto tcp dnat" in listed
    assert "udp dport 53 dnat ip to 10.255.255.1:2" in listed
    full = netns.ruleset(1, 2, parse("full"), blocked, [ipaddress.ip_network("10.8.0.0/16")])
    assert "\n        meta l4proto tcp dnat ip to 10.255.255.1:1" in full
    assert "10.8.0.0/16 } accept" in full and "oifname" not in full


def test_http_heads_read_one_way_only() -> None:
    """A head another reader could take for another host names none (then refused)."""
    ok = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"
    assert inspect(ok).name == "a.test"
    for bad in (b"GET / HTTP/1.1\nHost: a.test\n\n",  # bare LF
                b"GET / HTTP/1.1\r\nHost: a.test\nX: y\r\n\r\n",  # one bare LF inside
                b"GET / HTTP/1.1\r\nHost : b.test\r\nHost: a.test\r\n\r\n",  # "Host :"
                b"GET / HTTP/1.1\r\nX: y\r\n Host: b.test\r\nHost: a.test\r\n\r\n",  # fold
                b"GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",  # target elsewhere
                b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
                b"GET / HTTP/1.1\r\nX: y\r\n\r\n"):  # no Host
        hello = inspect(bad)
        assert hello.kind == "http" and hello.name is None, bad
    assert inspect(b"GET http://A.test:81/x HTTP/1.1\r\nHost: a.test:81\r\n\r\n").name == "a.test"
    assert inspect(b"GET / HTTP/1.1\r\nHost: 93.184.216.34\r\n\r\n").name == "93.184.216.34"


def test_a_host_that_is_an_address_must_be_the_address() -> None:
    fake = FakeAddresses()
    listed = _resolver(["93.184.216.0/24", "a.test"])
    assert _decide(listed, fake, PUBLIC, PUBLIC)[0]  # curl http://93.184.216.34/
    allowed, why, _ = _decide(listed, fake, PUBLIC, "93.184.216.35")
    assert not allowed and "may not ask for 93.184.216.35" in why
    allowed, why, _ = _decide(listed, fake, fake.address_for("a.test"), PUBLIC)
    assert not allowed and "may not ask for" in why


def test_unreadable_first_bytes_are_refused_before_the_policy() -> None:
    from agent_sandbox.backends.runc.netproxy.decide import unreadable
    from agent_sandbox.backends.runc.netproxy.peek import Hello

    assert "Host header" in unreadable(Hello("http"))
    assert "did not finish" in unreadable(Hello("incomplete"))
    assert unreadable(Hello("http", "a.test")) == unreadable(Hello("tls")) == ""
    assert unreadable(Hello("other")) == ""  # server speaks first: decided by address


def test_an_absolute_form_request_is_the_only_one_on_its_connection() -> None:
    from agent_sandbox.backends.runc.netproxy.explicit import _one_request

    head = (b"GET / HTTP/1.1\r\nHost: a.test\r\nProxy-Connection: keep-alive\r\n"
            b"connection : Keep-Alive\r\nKeep-Alive: 300\r\nAccept: */*\r\n\r\n")
    assert _one_request(head) == (b"GET / HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\n"
                                  b"Connection: close\r\n\r\n")


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    listener.close()
    for s in (a, b):
        s.setblocking(False)
    return a, b


def test_the_relay_carries_both_ways_with_half_close() -> None:
    from agent_sandbox.backends.runc.netproxy.relay import relay

    async def go() -> tuple[bytes, bytes]:
        loop = asyncio.get_running_loop()
        client, proxy_side = _tcp_pair()
        proxy_up, server = _tcp_pair()
        relaying = asyncio.ensure_future(relay(proxy_side, proxy_up))
        request, reply = os.urandom(1 << 20), os.urandom(3 << 20)

        async def read_all(sock: socket.socket) -> bytes:
            out = b""
            while chunk := await loop.sock_recv(sock, 1 << 16):
                out += chunk
            return out

        async def serve() -> bytes:
            got = await read_all(server)  # the client's half-close arrives as an end
            await loop.sock_sendall(server, reply)
            server.close()
            return got

        async def ask() -> bytes:
            await loop.sock_sendall(client, request)
            client.shutdown(socket.SHUT_WR)
            return await read_all(client)

        got_request, got_reply = await asyncio.gather(serve(), ask())
        await asyncio.wait_for(relaying, 5)
        client.close()
        assert got_request == request and got_reply == reply
        return got_request, got_reply

    asyncio.run(go())


def test_the_relay_resets_one_side_when_the_other_fails() -> None:
    from agent_sandbox.backends.runc.netproxy.relay import relay, reset

    async def go() -> None:
        loop = asyncio.get_running_loop()
        client, proxy_side = _tcp_pair()
        proxy_up, server = _tcp_pair()
        relaying = asyncio.ensure_future(relay(proxy_side, proxy_up))
        await loop.sock_sendall(client, b"hello")
        assert await loop.sock_recv(server, 5) == b"hello"
        reset(server)
        await asyncio.wait_for(relaying, 5)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(loop.sock_recv(client, 5), 5)
        client.close()

    asyncio.run(go())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.sampled_from([b"", b"GET / HTTP/1.1\r\n", b"CONNECT ",
                                                   b"\x16\x03\x01\x02\x00\x01"]))
def test_hostile_heads_never_raise(data: bytes, prefix: bytes) -> None:
    from agent_sandbox.backends.runc.netproxy.decide import unreadable

    hello = inspect(prefix + data)
    assert hello.kind in ("tls", "http", "other", "partial")
    unreadable(hello)


def _ede(reply: dns.message.Message | None) -> tuple[int, str]:
    assert reply is not None
    found = [o for o in reply.options if isinstance(o, dns.edns.EDEOption)]
    return reply.rcode(), found[0].text if found else ""


def test_a_name_resolving_only_to_blocked_addresses_names_them_and_the_setting(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal of an allowed name the host resolves to a reserved range names the
    address, its range and the operator setting that opens it: in the 403 (decide), the
    DNS answer's extended error and the log; a ``full`` sandbox is told less."""
    fake = FakeAddresses()
    listed = _resolver(["doc.test"], host=True)
    allowed, why, _ = _decide(listed, fake, fake.address_for("doc.test"))
    assert not allowed and f"doc.test resolves only to {DOC} (in 203.0.113.0/24)" in why, why
    assert f"ABX_NETWORK_OPEN_RANGES={DOC}/32" in why, why
    rcode, text = _ede(_ask(DnsServer(listed, fake, Log()),
                            dns.message.make_query("doc.test", "A", use_edns=0).to_wire()))
    assert rcode == dns.rcode.NXDOMAIN and text.startswith(why[:150]), text
    full = _resolver({"deny_out": ["bad.test"]}, host=True)
    decision = asyncio.run(decide(full, fake, fake.address_for("doc.test"), None))
    assert not decision.allowed and DOC not in decision.why, decision
    assert "ABX_NETWORK_OPEN_RANGES" in decision.why and DOC in decision.log_text, decision
    # Not pinned: the real lookup path (the host's getaddrinfo, as for every name).
    found = asyncio.run(full.resolve("localhost"))
    assert not found.reachable and found.blocked[0][0] == "127.0.0.1", found
    assert "localhost resolves only to 127.0.0.1 (in 127." in found.why_not("localhost")
    capsys.readouterr()
    rcode, text = _ede(_ask(DnsServer(full, fake, Log()),
                            dns.message.make_query("doc.test", "A", use_edns=0).to_wire()))
    assert rcode == dns.rcode.NXDOMAIN and DOC not in text, text
    assert "the host's proxy log names them" in text, text
    assert f"refused: DNS doc.test: doc.test resolves only to {DOC} (in 203.0.113.0/24)" \
        in capsys.readouterr().err
    assert Found().why_not("x.test") == "x.test does not resolve on the host"


def test_a_broken_lookup_gets_an_answer_and_fails_the_proxy_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a proxy whose user cannot read its Python did: getaddrinfo's thread pool
    failed to import, and the DNS query went unanswered (the sandbox waited, retried
    and gave up; connections were reset). Now the query gets SERVFAIL saying why, and
    the proxy's start check (Resolver.check) fails, naming it."""
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise ModuleNotFoundError("No module named 'concurrent.futures.thread'")

    resolver = _resolver(["x.test"])
    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", broken)
    reply = _ask(DnsServer(resolver, FakeAddresses(), Log()),
                 dns.message.make_query("x.test", "A", use_edns=0).to_wire())
    rcode, text = _ede(reply)
    assert rcode == dns.rcode.SERVFAIL and "ModuleNotFoundError" in text, text
    with pytest.raises(OSError, match="name lookups fail in the proxy: ModuleNotFoundError"):
        asyncio.run(resolver.check())
    monkeypatch.undo()
    asyncio.run(resolver.check())  # a working lookup passes, whatever it answers


def test_a_refused_tunnel_says_why_where_pip_shows_it(tmp_path: Path) -> None:
    """pip and requests show only the status line of a refused CONNECT (``Tunnel
    connection failed: 403 ...``), after their retries: the reason is in it."""
    import threading
    import urllib.error
    import urllib.request

    from agent_sandbox.backends.runc.netproxy import explicit
    from agent_sandbox.backends.runc.netproxy.tcp import TcpProxy

    proxy = TcpProxy(_resolver(["doc.test"], host=True), FakeAddresses(), Log())
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    seen: list[str] = []

    def client() -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": url}))
        try:
            opener.open("https://doc.test/simple/", timeout=10)
        except urllib.error.URLError as exc:
            seen.append(str(exc.reason))

    async def serve() -> None:
        thread = threading.Thread(target=client)
        thread.start()
        conn, _ = await asyncio.get_running_loop().sock_accept(listener)
        conn.setblocking(False)
        await explicit.handle(proxy, conn)
        await asyncio.to_thread(thread.join)

    asyncio.run(serve())
    listener.close()
    assert seen and seen[0].startswith("Tunnel connection failed: 403 Forbidden by sandbox "
                                       f"network policy: doc.test resolves only to {DOC} "
                                       "(in 203.0.113.0/24)"), seen
    assert f"ABX_NETWORK_OPEN_RANGES={DOC}/32" in seen[0], seen
