"""The policy proxy as a real process, without the engine or runc: a network namespace of
a sleeping ``unshare -n`` process is set up exactly as the engine sets up a sandbox's
(runtime/netns.setup, runtime/netproc.start: lo address, default route, nft table, the
proxy's sockets made inside and handed over), then probes run inside that namespace with
nsenter. The "internet" is tests/netprobe.py's servers on 127.0.0.2 (HTTP) and 127.0.0.3
(HTTPS) of the host, named pypi.test and tls.test by the proxy's hosts map.

Also prints the relay's throughput on a 10 MB download (transparent and explicit proxy,
and the host's own floor) and the idle proxy's RSS: figures, not asserts."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netprobe import (
    ECONNREFUSED,
    EPERM,
    FAST,
    FORBIDDEN,
    HTTP_ADDR,
    HTTP_NAME,
    TLS_ADDR,
    TLS_NAME,
    internet,
)

from agent_sandbox.backends.runc.netproxy import launch as netproc
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.network import parse

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, nft)"),
    pytest.mark.skipif(any(shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") is None
                           for t in ("nft", "unshare", "nsenter", "ip")),
                       reason="needs nft, unshare, nsenter and ip"),
]

BLOB_MB = 10
GATEWAY, PROXY_PORT = "10.255.255.1", 3128

# Inside the netns: each call gives [result, seconds]; results are errnos (0: connected),
# HTTP statuses with the start of the body, or error names.
_PROBE = textwrap.dedent(r"""
    import json, socket, ssl, sys, time
    def timed(fn):
        t = time.monotonic()
        try:
            out = fn()
        except socket.gaierror:
            out = "gaierror"
        except ssl.SSLError as e:
            out = type(e).__name__
        except OSError as e:
            out = e.errno if isinstance(e.errno, int) else type(e).__name__
        return [out, round(time.monotonic() - t, 3)]
    def _talk(host, port, payload, sni=None, cafile=None, limit=400):
        s = socket.create_connection((host, port), timeout=5)
        if sni:
            ctx = ssl.create_default_context(cafile=cafile)
            ctx.check_hostname = False
            s = ctx.wrap_socket(s, server_hostname=sni)
        with s:
            s.sendall(payload.encode())
            data = b""
            while len(data) < limit:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    if not data:
                        raise
                    break  # a kept-alive connection: what came is the answer
                if not chunk:
                    break
                data += chunk
                s.settimeout(1)
        if not data:
            return "closed"
        head = data.decode(errors="replace")
        return [int(head.split()[1]) if head.startswith("HTTP/") else head[:40], head[:400]]
    def raw(host, port, payload, sni=None, cafile=None):
        return timed(lambda: _talk(host, port, payload, sni, cafile))
    def tunnel(host, port, sni, cafile):
        # CONNECT host:port through the explicit proxy, then TLS with sni inside
        def go():
            s = socket.create_connection((GATEWAY, 3128), timeout=5)
            s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(1)
                if not chunk:
                    return "closed"
                head += chunk
            if not head.startswith(b"HTTP/1.1 200"):
                return head.decode()[:100]
            ctx = ssl.create_default_context(cafile=cafile)
            ctx.check_hostname = False
            with ctx.wrap_socket(s, server_hostname=sni) as t:
                t.sendall(f"GET / HTTP/1.1\r\nHost: {sni}\r\n\r\n".encode())
                data = b""
                while chunk := t.recv(400):
                    data += chunk
                return [200, data.decode(errors="replace")]
        return timed(go)
    def tcp(host, port):
        def go():
            socket.create_connection((host, port), timeout=5).close(); return 0
        return timed(go)
    def resolve(name):
        return timed(lambda: socket.gethostbyname(name))
    def dnsq(name, qtype, server="10.255.255.1"):
        import dns.message, dns.query, dns.rcode
        def go():
            q = dns.message.make_query(name, qtype, use_edns=0)
            r = dns.query.udp(q, server, timeout=3)
            ede = [o.text for o in r.options if getattr(o, "otype", 0) == 15]
            return [dns.rcode.to_text(r.rcode()), [str(a) for a in r.answer], ede]
        return timed(go)
    def garbage(n):
        def go():
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for i in range(n):
                u.sendto(bytes((i * 7 + j) % 256 for j in range(i % 300)), ("10.255.255.1", 53))
            return 0
        return timed(go)
    def udp(host, port):
        def go():
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b"x" * 20, (host, port)); return 0
        return timed(go)
    def download(host, port, path, proxied):
        def go():
            target = (GATEWAY, 3128) if proxied else (host, port)
            s = socket.create_connection(target, timeout=10)
            url = f"http://{host}:{port}{path}" if proxied else path
            s.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            buf = bytearray(1 << 20)
            size = 0
            while n := s.recv_into(buf):
                size += n
            s.close()
            return size
        return timed(go)
    GATEWAY = "10.255.255.1"
    calls = json.loads(sys.stdin.readline())
    print(json.dumps([globals()[c[0]](*c[1:]) for c in calls]))
""")


class Netns:
    """A network namespace set up like a sandbox's, with its proxy running."""

    def __init__(self, tmp: Path, policy: Any) -> None:
        self.tmp = tmp
        self.sleeper = subprocess.Popen(["unshare", "-n", "sleep", "600"])
        ours = os.stat("/proc/self/ns/net").st_ino
        deadline = time.monotonic() + 5
        while os.stat(f"/proc/{self.sleeper.pid}/ns/net").st_ino == ours:
            assert time.monotonic() < deadline, "unshare -n did not make a namespace"
            time.sleep(0.005)
        self.config = EngineConfig(
            data_dir=tmp, network_hosts=(f"{HTTP_NAME}={HTTP_ADDR}", f"{TLS_NAME}={TLS_ADDR}"),
            network_open_ranges=(f"{HTTP_ADDR}/32", f"{TLS_ADDR}/32"))
        self.resolv = tmp / "resolv.conf"
        self.resolv.write_text(f"nameserver {GATEWAY}\noptions timeout:1 attempts:1\n")
        self.proxy = 0
        self.start(policy)

    def start(self, policy: Any) -> None:
        netproc.stop(self.proxy)
        self.proxy = netproc.start(self.tmp, self.sleeper.pid, parse(policy), self.config,
                                   join_userns=False)

    def run(self, calls: list[list[Any]]) -> list[list[Any]]:
        """Run the probe's ``calls`` inside the namespace, with its resolv.conf."""
        script = f"mount --bind {self.resolv} /etc/resolv.conf && exec \"$0\" -I -c \"$1\""
        proc = subprocess.run(
            ["nsenter", f"--net=/proc/{self.sleeper.pid}/ns/net", "--", "unshare", "-m",
             "--propagation", "private", "--", "sh", "-c", script, sys.executable, _PROBE],
            input=json.dumps(calls) + "\n", capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        netproc.stop(self.proxy)
        self.sleeper.kill()
        self.sleeper.wait()


@pytest.fixture
def net(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with internet(tmp_path) as servers:
        (tmp_path / "ca.pem").write_text(servers["cert"])
        blob = tmp_path / "index" / "simple" / "blob"
        blob.write_bytes(os.urandom(1 << 20) * BLOB_MB)
        ns = Netns(tmp_path, [HTTP_NAME, TLS_NAME])
        try:
            yield {**servers, "ns": ns, "ca": str(tmp_path / "ca.pem")}
        finally:
            ns.close()


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # answers every request of a connection

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = f"hello {self.headers.get('Host')} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def keep_alive() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer((HTTP_ADDR, 0), _KeepAlive)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _fast(result: list[Any], expected: Any, what: str) -> None:
    got, took = result
    assert got == expected or (isinstance(got, list) and got[0] == expected), \
        f"{what}: {got!r}, expected {expected!r}"
    assert took < FAST, f"{what} took {took}s: a refusal must be immediate"


def _get(host: str, path: str = "/", proxied: bool = False, port: int = 80) -> str:
    target = f"http://{host}:{port}{path}" if proxied else path
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"


def test_allowed_names_over_http_and_https_and_everything_else_refused_at_once(
        net: dict[str, Any]) -> None:
    ns, http_port, tls_port, ca = net["ns"], net["http_port"], net["tls_port"], net["ca"]
    stand_in = ns.run([["resolve", HTTP_NAME]])[0][0]
    out = ns.run([
        ["raw", HTTP_NAME, http_port, _get(HTTP_NAME)],  # 0 allowed, HTTP
        ["raw", TLS_NAME, tls_port, _get(TLS_NAME), TLS_NAME, ca],  # 1 allowed, HTTPS
        ["raw", GATEWAY, PROXY_PORT, _get(HTTP_NAME, proxied=True, port=http_port)],  # 2
        ["dnsq", "evil.test", "A"],  # 3 not listed: NXDOMAIN naming the policy
        ["resolve", "evil.test"],  # 4 ... and the system resolver fails at once
        ["dnsq", HTTP_NAME, "AAAA"],  # 5 IPv4 only: no data
        ["raw", "198.18.0.77", 80, _get("evil.test")],  # 6 forced connect, unlisted Host
        ["tcp", "198.18.0.77", 443],  # 7 ... forced, no bytes: connects, then reset
        ["raw", "198.18.0.77", 443, "\x16\x03\x01\x00\x05hello"],  # 8 garbage TLS: reset
        ["tcp", "93.184.216.34", 80],  # 9 a raw public address
        ["raw", stand_in, http_port, _get("evil.test")],  # 10 allowed IP, other Host
        ["raw", TLS_NAME, tls_port, _get(TLS_NAME), "evil.test", ca],  # 11 ... other SNI
        ["dnsq", "example.com", "A", "8.8.8.8"],  # 12 DNS to an outside resolver
        ["tcp", "8.8.8.8", 53],  # 13 ... over TCP
        ["udp", "203.0.113.9", 443],  # 14 any other UDP
        ["raw", GATEWAY, PROXY_PORT, _get("evil.test", proxied=True)],  # 15 explicit, unlisted
        *[["tcp", a, 80] for a in FORBIDDEN],  # 16.. blocked ranges
    ])
    assert out[0][0][0] == 200 and f"hello {HTTP_NAME}" in out[0][0][1], out[0]
    assert out[1][0][0] == 200 and f"hello {TLS_NAME}" in out[1][0][1], out[1]
    assert out[2][0][0] == 200 and f"hello {HTTP_NAME}" in out[2][0][1], out[2]
    rcode, answers, ede = out[3][0]
    assert rcode == "NXDOMAIN" and not answers and out[3][1] < FAST, out[3]
    assert ede and "not allowed by the sandbox network policy allowlist" in ede[0], out[3]
    _fast(out[4], "gaierror", "an unlisted name")
    assert out[5][0][:2] == ["NOERROR", []] and out[5][1] < FAST, out[5]
    _fast(out[6], 403, "a forced connect with an unlisted Host")
    assert "blocked by the sandbox network policy" in out[6][0][1], out[6]
    assert out[7][1] < FAST + 1.2, out[7]  # the proxy waits a second for first bytes
    assert out[8][0] in (104, "closed") and out[8][1] < FAST, out[8]  # ECONNRESET
    _fast(out[9], ECONNREFUSED, "a raw public address")
    _fast(out[10], 403, "an allowed name's address with another Host")
    assert "may not ask for evil.test" in out[10][0][1], out[10]
    assert out[11][0] in (104, "closed", "SSLEOFError", "SSLZeroReturnError") \
        and out[11][1] < FAST, f"an allowed name's address with another SNI: {out[11]}"
    _fast(out[12], EPERM, "DNS to an outside resolver")
    _fast(out[13], ECONNREFUSED, "TCP DNS to an outside resolver")
    _fast(out[14], EPERM, "other UDP")
    _fast(out[15], 403, "the explicit proxy, an unlisted name")
    assert "not allowed by network policy allowlist" in out[15][0][1], out[15]
    for address, result in zip(FORBIDDEN, out[16:], strict=True):
        _fast(result, ECONNREFUSED, f"blocked range {address}")


def test_fronting_through_an_allowed_name_is_refused(net: dict[str, Any],
                                                     keep_alive: int) -> None:
    """An allowed name's connection may not carry a request for another name: a CONNECT
    tunnel's SNI/Host, a second request on a kept-alive connection, a Host the proxy
    cannot read (bare LF line ends), an absolute-form target in a transparent request."""
    ns, http_port, tls_port, ca = net["ns"], net["http_port"], net["tls_port"], net["ca"]
    connect = f"CONNECT {HTTP_NAME}:{http_port} HTTP/1.1\r\nHost: {HTTP_NAME}\r\n\r\n"
    keep = (f"GET http://{HTTP_NAME}:{keep_alive}/ HTTP/1.1\r\nHost: {HTTP_NAME}\r\n\r\n"
            f"GET http://evil.test:{keep_alive}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n")
    out = ns.run([
        ["raw", GATEWAY, PROXY_PORT, connect + _get("evil.test")],  # 0 tunnel, other Host
        ["raw", GATEWAY, PROXY_PORT, connect + _get(HTTP_NAME)],  # 1 tunnel, its own Host
        ["raw", GATEWAY, PROXY_PORT, keep],  # 2 the second request is not answered
        ["raw", HTTP_NAME, http_port, "GET / HTTP/1.1\nHost: evil.test\n\n"],  # 3 bare LF
        ["raw", HTTP_NAME, http_port, _get("x").replace("GET /", "GET http://evil.test/")
         .replace("Host: x", f"Host: {HTTP_NAME}")],  # 4 absolute-form, transparent
        ["raw", HTTP_NAME, http_port, f"GET / HTTP/1.1\r\nHost: {HTTP_NAME}\r\n"
         "Host: evil.test\r\n\r\n"],  # 5 two Hosts
        ["tunnel", TLS_NAME, tls_port, "evil.test", ca],  # 6 tunnel, other SNI
        ["tunnel", TLS_NAME, tls_port, TLS_NAME, ca],  # 7 tunnel, its own SNI
        ["raw", HTTP_NAME, http_port, f"GET / HTTP/1.1\r\nHost : evil.test\r\n"
         f"Host: {HTTP_NAME}\r\n\r\n"],  # 8 "Host :" that some servers take
    ])
    # A tunnel is answered "200 Connection established" before its first bytes are seen.
    tunnel, took = out[0]
    assert "403 Forbidden by sandbox network policy" in tunnel[1] and took < FAST, out[0]
    assert "hello evil.test" not in tunnel[1], out[0]
    assert f"hello {HTTP_NAME}" in out[1][0][1], out[1]
    bodies = out[2][0][1] if isinstance(out[2][0], list) else ""
    assert f"hello {HTTP_NAME}" in bodies and "hello evil.test" not in bodies, out[2]
    assert out[6][0] in (104, "closed", "SSLEOFError", "SSLZeroReturnError") \
        and out[6][1] < FAST, f"a tunnel to an allowed name with another SNI: {out[6]}"
    assert out[7][0][0] == 200 and f"hello {TLS_NAME}" in out[7][0][1], out[7]
    bad = [(what, out[i]) for i, what in ((3, "bare LF"), (4, "absolute-form target"),
                                          (5, "two Hosts"), (8, "a spaced Host"))
           if not (isinstance(out[i][0], list) and out[i][0][0] == 403 and out[i][1] < FAST)]
    assert not bad, bad


def test_throughput_and_idle_memory(net: dict[str, Any]) -> None:
    ns, http_port = net["ns"], net["http_port"]
    status = Path(f"/proc/{ns.proxy}/status").read_text()
    rss = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
    path = "/simple/blob"
    calls = [["download", HTTP_NAME, http_port, path, proxied] for proxied in (False, True)]
    out = ns.run(calls * 3)
    floor = _host_download(http_port, path)
    size = BLOB_MB << 20
    for result in out:
        assert result[0] == size + 0 or result[0] > size, result  # headers + body
    best = {p: min(r[1] for r, c in zip(out, calls * 3, strict=True) if c[4] is p)
            for p in (False, True)}
    print(f"\nnetproxy idle RSS: {int(rss) / 1024:.1f} MiB")
    print(f"{BLOB_MB} MB download, best of 3: host direct {floor * 1000:.0f} ms "
          f"({BLOB_MB / floor:.0f} MB/s); transparent proxy {best[False] * 1000:.0f} ms "
          f"({BLOB_MB / best[False]:.0f} MB/s); explicit proxy {best[True] * 1000:.0f} ms "
          f"({BLOB_MB / best[True]:.0f} MB/s)")


def _host_download(port: int, path: str) -> float:
    import socket

    best = 1e9
    for _ in range(3):
        t = time.monotonic()
        with socket.create_connection((HTTP_ADDR, port)) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HTTP_NAME}\r\n\r\n".encode())
            buf = bytearray(1 << 20)
            while s.recv_into(buf):
                pass
        best = min(best, time.monotonic() - t)
    return best


def test_addresses_an_allowlist_names_by_number(net: dict[str, Any]) -> None:
    """CIDR entries: reached by number through the explicit proxy (inside the namespace
    127.x is its own loopback), with the address itself as Host or any SNI the policy
    does not deny; a denied name is still refused there."""
    ns, http_port, tls_port, ca = net["ns"], net["http_port"], net["tls_port"], net["ca"]
    ns.start({"allow_out": [f"{HTTP_ADDR}/32", f"{TLS_ADDR}/32"], "deny_out": ["evil.test"]})
    out = ns.run([
        ["raw", GATEWAY, PROXY_PORT, _get(HTTP_ADDR, proxied=True, port=http_port)],
        ["tunnel", TLS_ADDR, tls_port, TLS_NAME, ca],
        ["tunnel", TLS_ADDR, tls_port, "evil.test", ca],
        ["raw", GATEWAY, PROXY_PORT, _get(HTTP_NAME, proxied=True, port=http_port)],
    ])
    assert out[0][0][0] == 200 and f"hello {HTTP_ADDR}" in out[0][0][1], out[0]
    assert out[1][0][0] == 200 and f"hello {TLS_NAME}" in out[1][0][1], out[1]
    assert out[2][0] in (104, "closed", "SSLEOFError", "SSLZeroReturnError") \
        and out[2][1] < FAST, f"a denied SNI to an allowed address: {out[2]}"
    _fast(out[3], 403, "a name the allowlist does not list")
