"""network=True reaches the internet only: the host (on any of its addresses, and as
slirp's gateway 10.0.2.2), the LAN and link-local (cloud metadata) are refused at once by
the egress filter the host installs in the sandbox's network namespace; the sandbox's own
loopback and slirp's DNS forwarder keep working; the sandbox cannot change the filter.

Traffic only ever goes to this machine. The one probe of another range (169.254.169.254)
runs after the filter is seen installed, so its SYN never leaves the sandbox's netns.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.errors import RuntimeUnavailableError
from agent_sandbox.providers.local import local_provider
from agent_sandbox.runtime import egress

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("slirp4netns") is None,
                                reason="slirp4netns not installed")]

ECONNREFUSED, EPERM, EHOSTUNREACH = 111, 1, 113
FAST = 1.0  # seconds: a refusal is immediate, never a timeout

# Run inside the sandbox: tcp(host, port) -> [errno or 0, seconds].
_PROBE = textwrap.dedent("""
    import json, socket, struct, time
    def tcp(host, port):
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.settimeout(3)
        t = time.monotonic()
        try:
            s.connect((host, port)); err = 0
        except OSError as e:
            err = e.errno or -1
        finally:
            s.close()
        return [err, time.monotonic() - t]
    def dns(host):
        q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\\x09localhost\\x00" \\
            + struct.pack(">HH", 1, 1)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(2)
        t = time.monotonic()
        try:
            u.connect((host, 53)); u.send(q); u.recv(512); out = "answer"
        except socket.timeout:
            out = "timeout"
        except OSError as e:
            out = e.errno or -1
        return [out, time.monotonic() - t]
""")


def _py(sb: Sandbox, code: str) -> Any:
    res = sb.commands.run("python3 -", stdin=_PROBE + textwrap.dedent(code), timeout=60)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _host_ipv4s() -> list[str]:
    """The host's own IPv4 addresses but loopback (where a 0.0.0.0 listener answers)."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    return [a["local"] for link in json.loads(out) for a in link.get("addr_info", [])
            if a.get("local") and not a["local"].startswith("127.")]


def _nsenter(pid: int) -> list[str]:
    if os.geteuid() == 0:
        return ["nsenter", f"--net=/proc/{pid}/ns/net"]
    return ["nsenter", "--user", "--net", "--preserve-credentials", "-t", str(pid)]


def _netns(sb: Sandbox) -> tuple[int, str]:
    """From the host: the sandbox's netns inode and our table in it ('' if absent)."""
    state = local_provider().runc.state(sb.sandbox_id)
    assert state is not None
    pid = state["pid"]
    inode = os.stat(f"/proc/{pid}/ns/net").st_ino
    out = subprocess.run([*_nsenter(pid), "nft", "list", "table", "inet", egress.TABLE],
                         capture_output=True, text=True)
    return inode, out.stdout if out.returncode == 0 else ""


def _assert_filtered(sb: Sandbox) -> None:
    _, table = _netns(sb)
    assert "reject with tcp reset" in table, f"no egress filter in the sandbox's netns: {table}"
    assert "169.254.0.0/16" in table and "10.0.0.0/8" in table, table


@pytest.fixture
def host_listener() -> Iterator[socket.socket]:
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))  # every host address
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


@pytest.fixture
def net_sandbox() -> Iterator[Sandbox]:
    sb = Sandbox.create(network=True)
    yield sb
    try:
        sb.kill(delete_volume=True)
    except Exception:  # noqa: BLE001 - a test may have killed it already
        pass


def _assert_host_refused(sb: Sandbox, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    targets = [*_host_ipv4s(), "10.0.2.2"]
    # An AF_INET6 socket to a v4-mapped address sends IPv4: filtered the same.
    targets += [f"::ffff:{a}" for a in targets]
    out = _py(sb, f"print(json.dumps({{h: tcp(h, {port}) for h in {targets!r}}}))")
    for host, (err, took) in out.items():
        assert err == ECONNREFUSED and took < FAST, f"{host}: errno {err} in {took:.3f}s"
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing got through


def test_host_listener_unreachable_on_every_address(net_sandbox: Sandbox,
                                                    host_listener: socket.socket) -> None:
    _assert_host_refused(net_sandbox, host_listener)


def test_metadata_address_refused_at_once(net_sandbox: Sandbox) -> None:
    _assert_filtered(net_sandbox)  # first: without it, the SYN below would leave the host
    err, took = _py(net_sandbox, "print(json.dumps(tcp('169.254.169.254', 80)))")
    assert err == ECONNREFUSED and took < FAST, (err, took)


def test_sandbox_loopback_still_works(net_sandbox: Sandbox) -> None:
    _assert_filtered(net_sandbox)
    out = _py(net_sandbox, """
        import threading
        res = {}
        for host in ("127.0.0.1", "127.0.0.2"):
            srv = socket.socket(); srv.bind((host, 0)); srv.listen(1)
            threading.Thread(target=lambda s=srv: s.accept()[0].sendall(b"hi"),
                             daemon=True).start()
            c = socket.create_connection(srv.getsockname(), timeout=3)
            res[host] = c.recv(2).decode()
        print(json.dumps(res))
    """)
    assert out == {"127.0.0.1": "hi", "127.0.0.2": "hi"}


def test_dns_forwarder_allowed_gateway_not(net_sandbox: Sandbox) -> None:
    _assert_filtered(net_sandbox)
    resolv = net_sandbox.commands.run("cat /etc/resolv.conf").stdout
    assert resolv.split() == ["nameserver", egress.DNS], resolv
    out = _py(net_sandbox, "print(json.dumps([dns('10.0.2.3'), dns('10.0.2.2')]))")
    (dns_result, _), (gateway, took) = out
    # An answer, or a timeout where the host's resolver is unreachable: never refused.
    assert dns_result in ("answer", "timeout"), dns_result
    # The same query to slirp's gateway (the host) is dropped before it is sent.
    assert gateway in (EPERM, EHOSTUNREACH) and took < FAST, (gateway, took)


def test_filter_survives_reset_rootfs(net_sandbox: Sandbox,
                                      host_listener: socket.socket) -> None:
    before, _ = _netns(net_sandbox)
    _assert_filtered(net_sandbox)
    net_sandbox.reset_rootfs()
    after, _ = _netns(net_sandbox)
    assert after != before  # a new netns...
    _assert_filtered(net_sandbox)  # ...filtered too
    _assert_host_refused(net_sandbox, host_listener)


def test_sandbox_cannot_change_the_filter(net_sandbox: Sandbox,
                                          host_listener: socket.socket) -> None:
    for cmd in ("nft list ruleset", "nft flush ruleset",
                f"nft delete table inet {egress.TABLE}",
                "ip route replace default via 10.0.2.2 dev tap0",
                "ip route del default", "ip link set tap0 down",
                "ip addr add 10.0.2.2/32 dev lo"):
        res = net_sandbox.commands.run(cmd)
        assert res.exit_code != 0, f"{cmd!r} succeeded inside: {res.stdout}"
        assert "not permitted" in res.stderr.lower(), (cmd, res.stderr)
    # A socket bound to lo passes the filter's lo rule, but lo leads back into the netns.
    port = host_listener.getsockname()[1]
    out = _py(net_sandbox, f"""
        res = {{}}
        for host in ("10.0.2.2", *{_host_ipv4s()!r}):
            s = socket.socket(); s.settimeout(1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
            try:
                s.connect((host, {port})); res[host] = 0
            except OSError as e:
                res[host] = e.errno or -1
        print(json.dumps(res))
    """)
    assert 0 not in out.values(), out
    _assert_filtered(net_sandbox)
    _assert_host_refused(net_sandbox, host_listener)
    assert "tap0" in net_sandbox.commands.run("ip -o link show up").stdout


def _count() -> int:
    return len(local_provider().list())


def test_without_nft_network_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    which = shutil.which
    monkeypatch.setattr(egress.shutil, "which",
                        lambda name, **kw: None if name == "nft" else which(name, **kw))
    before = _count()
    with pytest.raises(RuntimeUnavailableError, match="apt-get install nftables"):
        Sandbox.create(network=True)
    assert _count() == before  # nothing left running unfiltered


def test_filter_that_cannot_load_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a kernel without nf_tables (or its reject module) answers: nft fails.
    monkeypatch.setattr(egress, "ruleset", lambda host: "table inet t { chain c { bogus } }")
    before = _count()
    with pytest.raises(RuntimeUnavailableError, match="modprobe nf_tables"):
        Sandbox.create(network=True)
    assert _count() == before


def test_never_installed_in_the_hosts_netns() -> None:
    host_rules = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True)
    with pytest.raises(RuntimeUnavailableError, match="shares the host's net namespace"):
        egress.install(os.getpid(), join_userns=os.geteuid() != 0)
    after = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True)
    assert after.stdout == host_rules.stdout


def test_ruleset_covers_the_host_and_private_ranges() -> None:
    text = egress.ruleset(egress.host_networks())
    sets = re.findall(r"elements = \{([^}]*)\}", text)
    blocked = [ipaddress.ip_network(e.strip()) for part in sets for e in part.split(",")]
    host6 = subprocess.run(["ip", "-j", "-6", "addr", "show"], capture_output=True,
                           text=True, check=True).stdout
    for addr in ["0.0.0.1", "10.0.2.2", "100.64.0.1", "127.0.0.1", "169.254.169.254",
                 "172.17.0.1", "192.0.0.1", "192.168.1.1", "198.18.0.1", "224.0.0.1",
                 "255.255.255.255", "::1", "fd00::1", "fe80::1", "ff02::1", *_host_ipv4s(),
                 *(a["local"] for link in json.loads(host6) for a in link.get("addr_info", [])
                   if a.get("local"))]:
        assert any(ipaddress.ip_address(addr) in n for n in blocked), addr
    for addr in ["1.1.1.1", "8.8.8.8", "2606:4700::1111"]:  # the internet stays reachable
        assert not any(ipaddress.ip_address(addr) in n for n in blocked), addr
    chain = text.split("chain output", 1)[1].splitlines()
    rules = [line.strip() for line in chain if line.strip() not in ("", "{", "}")
             and "hook" not in line]
    assert rules[0] == 'oifname "lo" accept'
    assert rules[1].startswith(f"ip daddr {egress.DNS} ") and rules[1].endswith("accept")
    assert all("reject" in rule for rule in rules[2:]), rules


def test_rootless_path_enters_the_user_namespace(local_users: Any) -> None:
    """The rootless engine's way in (user namespace, then netns), on a plain user-owned
    netns: rootless slirp4netns itself needs /dev/net/tun usable by users."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    user = local_users.create()
    code = textwrap.dedent(f"""
        import os, subprocess, time
        from agent_sandbox.runtime import egress
        p = subprocess.Popen(["unshare", "--user", "--map-root-user", "--net", "sleep", "60"])
        try:
            ours = os.stat("/proc/self/ns/net").st_ino
            for _ in range(500):
                if os.stat(f"/proc/{{p.pid}}/ns/net").st_ino != ours:
                    break
                time.sleep(0.01)
            egress.install(p.pid, join_userns=True)
            out = subprocess.run(["nsenter", "--user", "--net", "--preserve-credentials",
                                  "-t", str(p.pid), "nft", "list", "table", "inet",
                                  "{egress.TABLE}"], capture_output=True, text=True)
            print(out.stdout)
        finally:
            p.kill()
    """)
    probe = user.run(["unshare", "--user", "--map-root-user", "--net", "true"])
    if probe.returncode != 0:
        pytest.skip(f"unprivileged user namespaces do not work here: {probe.stderr.strip()}")
    res = user.run([user.python(), "-c", code], timeout=60)
    assert res.returncode == 0, res.stderr
    assert "reject with tcp reset" in res.stdout and "169.254.0.0/16" in res.stdout, res.stdout
