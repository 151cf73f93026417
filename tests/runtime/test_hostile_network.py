"""Network containment, as attacks (run as root here, and as an unprivileged user against
rootless sandboxes by rootless_battery.py): whatever its policy, a sandbox reaches only
what the policy names, is refused at once otherwise, never reaches the host or the LAN,
cannot change its own rules, and cannot stop or bend the proxy with hostile bytes."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from netprobe import (
    ECONNREFUSED,
    EPERM,
    FAST,
    FORBIDDEN,
    HTTP_NAME,
    TLS_NAME,
    host_ipv4s,
    internet,
    run,
)

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration


def _fast(result: list[Any], expected: Any, what: str) -> None:
    got, took = result
    assert got == expected or (isinstance(got, list) and got[0] == expected), \
        f"{what}: {got!r}, expected {expected!r}"
    assert took < FAST, f"{what} took {took}s: a refusal must be immediate"


def test_an_allowlist_refuses_everything_else_at_once(tmp_path: Path) -> None:
    with internet(tmp_path) as net, Sandbox.create(network=[HTTP_NAME, TLS_NAME]) as sb:
        sb.files.write("/tmp/ca.pem", net["cert"])
        port, tls_port = net["http_port"], net["tls_port"]
        fake_http = run(sb, [["resolve", HTTP_NAME]])[0][0]
        out = run(sb, [
            ["resolve", "evil.test"],  # not listed: no such name
            ["tcp", "93.184.216.34", 80],  # a raw public address
            ["http", f"http://{fake_http}:{port}/", "evil.test"],  # listed name's address
            ["tls", TLS_NAME, tls_port, "evil.test", "/tmp/ca.pem"],  # ... other SNI
            ["udp", "8.8.8.8", 53],  # DNS to an outside resolver
            ["tcp", "8.8.8.8", 53],
            ["udp", "203.0.113.9", 443],  # any other UDP
            ["http", "http://evil.test/", None, True],  # the explicit proxy, unlisted name
            ["http", "http://127.0.0.2/", None, True],  # ... an address it must not reach
            ["tls", TLS_NAME, tls_port, TLS_NAME, "/tmp/ca.pem"],  # still fine after all that
            *[["tcp", a, 80] for a in FORBIDDEN],
        ])
    assert out[0][0] == "gaierror" and out[0][1] < FAST, out[0]
    _fast(out[1], ECONNREFUSED, "raw address")
    _fast(out[2], 403, "listed name's address with another Host")
    assert "may not ask for evil.test" in out[2][0][1], out[2]
    assert out[3][0] != 200 and out[3][1] < FAST, f"other SNI: {out[3]}"
    _fast(out[4], EPERM, "UDP DNS to an outside resolver")
    _fast(out[5], ECONNREFUSED, "TCP DNS to an outside resolver")
    _fast(out[6], EPERM, "other UDP")
    _fast(out[7], 403, "explicit proxy, unlisted name")
    assert "not allowed by network policy allowlist" in out[7][0][1], out[7]
    _fast(out[8], 403, "explicit proxy, a host address")
    assert out[9][0][0] == 200, out[9]
    for address, result in zip(FORBIDDEN, out[10:], strict=True):
        _fast(result, ECONNREFUSED, address)


def test_full_never_reaches_the_host_or_the_lan() -> None:
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))  # every host address
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    targets = [*host_ipv4s(), *FORBIDDEN]
    try:
        with Sandbox.create(network="full") as sb:
            out = run(sb, [["tcp", a, port] for a in targets]
                      + [["http", f"http://{a}:{port}/", None, True] for a in targets[:2]])
        for address, result in zip(targets, out, strict=False):
            _fast(result, ECONNREFUSED, f"full mode to {address}")
        for result in out[len(targets):]:
            _fast(result, 403, "full mode, through the explicit proxy, to the host")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing got through
    finally:
        listener.close()


def test_the_sandbox_cannot_change_its_network(tmp_path: Path) -> None:
    with internet(tmp_path) as net, Sandbox.create(network=[HTTP_NAME]) as sb:
        res = sb.commands.run(
            "nft flush ruleset; ip route replace default dev lo; ip addr flush dev lo; "
            "ip link add x type dummy; echo nameserver 1.1.1.1 > /etc/resolv.conf; "
            "mount --bind /tmp /etc; umount /etc/resolv.conf; cat /etc/resolv.conf")
        assert "nameserver 10.255.255.1" in res.stdout, res
        url = f"http://{HTTP_NAME}:{net['http_port']}/"
        allowed, raw, metadata = run(sb, [["http", url], ["tcp", "93.184.216.34", 80],
                                          ["tcp", "169.254.169.254", 80]])
        assert allowed[0][0] == 200, allowed
        _fast(raw, ECONNREFUSED, "raw address after the sandbox's attempts")
        _fast(metadata, ECONNREFUSED, "metadata after the sandbox's attempts")


_FLOOD = r'''  # noqa: E501 - a script for the sandbox
import os, socket, struct, threading, time
# Silent connections up to the proxy's cap and past it, garbage hellos, a huge header,
# a truncated ClientHello, malformed DNS: none of it may stop or wedge the proxy.
held = []
for _ in range(1100):
    try:
        s = socket.socket(); s.settimeout(2); s.connect(("198.18.0.77", 443)); held.append(s)
    except OSError:
        pass
payloads = (b"\x16\x03\x01\xff\xff" + os.urandom(300), b"GET / HTTP/1.1\r\nHost: " + b"a" * 70000,
            os.urandom(5000), b"\x16\x03\x01\x00\x05\x01\x00\x00\x01", b"CONNECT " + b"x" * 9000)
for payload in payloads:
    try:
        s = socket.create_connection(("10.255.255.1", 3128), timeout=2); s.sendall(payload)
        s.close()
    except OSError:
        pass
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(2000):
    u.sendto(os.urandom(300), ("10.255.255.1", 53))
query = struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x3f" + b"a" * 63 + b"\x00"
u.sendto(query + struct.pack(">HH", 255, 1), ("10.255.255.1", 53))
for s in held:
    s.close()
print(len(held))
'''


def test_hostile_bytes_do_not_stop_the_proxy(tmp_path: Path) -> None:
    with internet(tmp_path) as net, Sandbox.create(network=[HTTP_NAME]) as sb:
        sb.files.write("/tmp/flood.py", _FLOOD)
        res = sb.commands.run("python3 /tmp/flood.py", timeout=120)
        assert res.exit_code == 0, res.stderr[-2000:]
        url = f"http://{HTTP_NAME}:{net['http_port']}/"
        assert run(sb, [["http", url]])[0][0][0] == 200  # still serving, still deciding
