"""A networked sandbox's network namespace, set up by the host: every TCP connection and
DNS query goes to the policy proxy (backends/runc/netproxy), nothing else leaves.

The host enters the sandbox's netns (and, for the rootless engine, its user namespace
first: as that namespace's owner the user holds CAP_NET_ADMIN there) and runs a small
helper that puts the proxy's address 10.255.255.1 on lo with a default route through lo,
creates the proxy's TCP listener and the resolver's UDP socket there (kernel-chosen
ports: nothing in the sandbox can squat them), installs an nftables table that sends
every TCP connect to the listener (DNAT; SO_ORIGINAL_DST tells the proxy where it was
going) and DNS for 10.255.255.1 to the resolver, and refuses everything else at once
(UDP, ICMP, IPv6: EPERM / reset, never a silent drop). The two sockets come back to the
host over SCM_RIGHTS; a socket stays in the namespace it was made in, so the proxy
serves the sandbox while its own connections leave from the host's namespace.

The sandbox cannot change any of it: no CAP_NET_ADMIN (oci.CAPABILITIES, bounding set
too), seccomp refuses new user namespaces and setns. No nft, no nsenter, or a kernel
without nf_tables/nat: the network fails to start, it never runs unfiltered.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable

from agent_sandbox.backends.runc.netproxy.config import FAKE_RANGE, GATEWAY, PROXY_PORT
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.core.netrules import BLOCKED_V4, BLOCKED_V6
from agent_sandbox.core.network import NetworkPolicy

TABLE = "abx_net"
_TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_MODULES = "nf_tables nft_nat nft_reject_inet"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _tool(name: str, package: str) -> str:
    path = shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_TOOLS_PATH}")
    if path is None:
        raise RuntimeUnavailableError(
            f"a sandbox network needs {name} to keep the sandbox off the host and the LAN "
            f"(apt-get install {package}); without it no sandbox gets a network")
    return path


def check_tools() -> None:
    """Raise RuntimeUnavailableError naming the package of a missing tool."""
    for name, package in (("nft", "nftables"), ("ip", "iproute2"), ("nsenter", "util-linux")):
        _tool(name, package)


def _ip_json(ip: str, *args: str) -> list[dict]:
    proc = subprocess.run([ip, "-j", *args], capture_output=True, text=True,
                          env={"PATH": _TOOLS_PATH, "LC_ALL": "C"}, timeout=30)
    try:
        if proc.returncode != 0:
            raise ValueError(proc.stderr.strip())
        out = json.loads(proc.stdout or "[]")
        if not isinstance(out, list):
            raise ValueError("not a list")
        return [o for o in out if isinstance(o, dict)]
    except ValueError as exc:
        raise RuntimeUnavailableError(
            f"cannot read the host's addresses for the sandbox network filter "
            f"(ip -j {' '.join(args)}): {exc}") from None


def _network(text: object) -> Network | None:
    if not isinstance(text, str) or not text or text == "default":
        return None
    try:
        return ipaddress.ip_network(text.split("%", 1)[0], strict=False)
    except ValueError:
        return None


def host_networks() -> list[Network]:
    """Every address of the host (all interfaces, read now: they change), each on-link
    subnet (the LAN) and peer, and every entry of the local routing tables (local,
    broadcast and anycast addresses)."""
    ip = _tool("ip", "iproute2")
    found: list[Network | None] = []
    for link in _ip_json(ip, "addr", "show"):
        for info in link.get("addr_info") or []:
            if not isinstance(info, dict):
                continue
            local, prefix = info.get("local"), info.get("prefixlen")
            found.append(_network(local))
            found.append(_network(info.get("address")))  # a point-to-point peer
            if isinstance(local, str) and isinstance(prefix, int):
                found.append(_network(f"{local.split('%', 1)[0]}/{prefix}"))
    for family in ("-4", "-6"):
        for route in _ip_json(ip, family, "route", "show", "table", "local"):
            found.append(_network(route.get("dst")))
    return [n for n in found if n is not None]


def blocked_networks() -> list[Network]:
    """What no sandbox reaches whatever its policy: the fixed ranges above and every
    address and on-link network of the host, read now (they change)."""
    found = [*map(ipaddress.IPv4Network, BLOCKED_V4), *map(ipaddress.IPv6Network, BLOCKED_V6),
             *host_networks()]
    out: list[Network] = []
    for version in (4, 6):
        out.extend(ipaddress.collapse_addresses([n for n in found if n.version == version]))
    return out


def _set(networks: Iterable[Network], version: int) -> str:
    same = [n for n in networks if n.version == version]
    return ", ".join(str(n) for n in ipaddress.collapse_addresses(same))


def ruleset(tcp_port: int, udp_port: int, policy: NetworkPolicy,
            blocked: Iterable[Network], opened: Iterable[Network]) -> str:
    """The nft script (one transaction, replacing our table).

    ``guard`` (before NAT): the host, private and link-local ranges are refused at connect
    (a reset: ECONNREFUSED), except the sandbox's own loopback, the proxy's address, the
    names' addresses (FAKE_RANGE) and what the operator opened. ``nat_out``: TCP to the
    names' addresses, to the allowlist's CIDRs (every address for ``full``) and to the
    explicit proxy port goes to the proxy. ``out``: what is left was not for the proxy:
    TCP is reset, UDP/ICMP/IPv6 refused (EPERM) at once. Rules match addresses, never
    ``oifname "lo"``: the default route is through lo, so everything leaves "on lo"."""
    blocked, opened = list(blocked), list(opened)
    if policy.mode == "full":
        to_proxy = "meta l4proto tcp"
    else:
        cidrs = [n for n in policy._nets(policy.allow_out) if n.version == 4]
        to_proxy = f"ip daddr {{ {_set([ipaddress.IPv4Network(FAKE_RANGE), *cidrs], 4)} }} " \
                   "meta l4proto tcp"
    keep = f"127.0.0.0/8, {GATEWAY}, {FAKE_RANGE}"
    opened4 = _set(opened, 4)
    return f"""\
table inet {TABLE}
delete table inet {TABLE}
table inet {TABLE} {{
    chain guard {{
        type filter hook output priority -150; policy accept;
        ip daddr {{ {keep}{", " + opened4 if opened4 else ""} }} accept
        ip6 daddr ::1 accept
        ip daddr {{ {_set(blocked, 4)} }} meta l4proto tcp reject with tcp reset
    }}
    chain nat_out {{
        type nat hook output priority -100; policy accept;
        ip daddr 127.0.0.0/8 return
        ip6 daddr ::1 return
        ip daddr {GATEWAY} udp dport 53 dnat ip to {GATEWAY}:{udp_port}
        ip daddr {GATEWAY} tcp dport {PROXY_PORT} dnat ip to {GATEWAY}:{tcp_port}
        {to_proxy} dnat ip to {GATEWAY}:{tcp_port}
    }}
    chain out {{
        type filter hook output priority filter; policy accept;
        ip daddr {{ 127.0.0.0/8, {GATEWAY} }} accept
        ip6 daddr ::1 accept
        meta l4proto tcp reject with tcp reset
        reject with icmpx admin-prohibited
    }}
}}
"""


# Runs inside the sandbox's namespaces (host python; only the net and user namespaces are
# the sandbox's): set up lo, make the two sockets, install the rules, hand the sockets back.
_HELPER = """
import socket, subprocess, sys
chan, gateway, template = socket.socket(fileno=int(sys.argv[1])), sys.argv[2], sys.argv[3]
def run(*argv, text=None):
    p = subprocess.run(argv, input=text, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(argv[:3])}: {' '.join(p.stderr.split())[-500:]}")
run("ip", "link", "set", "lo", "up")
run("ip", "addr", "replace", gateway + "/32", "dev", "lo")
run("ip", "route", "replace", "default", "dev", "lo", "src", gateway)
tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
tcp.bind((gateway, 0))
tcp.listen(1024)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((gateway, 0))
run("nft", "-f", "-", text=template.replace("@TCP@", str(tcp.getsockname()[1]))
                                  .replace("@UDP@", str(udp.getsockname()[1])))
socket.send_fds(chan, [b"ok"], [tcp.fileno(), udp.fileno()])
"""


def nsenter_argv(nsenter: str, net_fd: int, user_fd: int | None) -> list[str]:
    """Into the container's network namespace by descriptor (the one checked), and for
    the rootless engine into its user namespace first."""
    if user_fd is None:
        return [nsenter, f"--net=/proc/self/fd/{net_fd}"]
    return [nsenter, f"--user=/proc/self/fd/{user_fd}", f"--net=/proc/self/fd/{net_fd}",
            "--preserve-credentials"]


def _open_ns(pid: int, kind: str) -> int:
    fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
    ours = os.stat(f"/proc/self/ns/{kind}")
    theirs = os.fstat(fd)
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
        os.close(fd)
        raise RuntimeUnavailableError(
            f"process {pid} shares the host's {kind} namespace: no sandbox network filter "
            "is installed there")
    return fd


def setup(pid: int, rules: str, *, join_userns: bool) -> tuple[socket.socket, socket.socket]:
    """Set up the netns of the container whose init is ``pid`` (see the module doc) and
    return the proxy's TCP listener and the resolver's UDP socket, both living there.
    ``rules``: ``ruleset``'s text with ``@TCP@`` and ``@UDP@`` for the sockets' ports.
    Idempotent: a running sandbox is set up again for each policy change."""
    check_tools()
    nsenter = _tool("nsenter", "util-linux")
    fds: list[int] = []
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        try:
            fds.append(_open_ns(pid, "net"))
            if join_userns:
                fds.append(_open_ns(pid, "user"))
        except OSError as exc:
            raise RuntimeUnavailableError(
                f"cannot enter the sandbox's network namespace to set it up: {exc}") from None
        argv = nsenter_argv(nsenter, fds[0], fds[1] if join_userns else None)
        try:
            proc = subprocess.run(
                [*argv, "--", sys.executable, "-I", "-c", _HELPER, str(theirs.fileno()),
                 GATEWAY, rules], capture_output=True, text=True,
                pass_fds=(*fds, theirs.fileno()), env={"PATH": _TOOLS_PATH, "LC_ALL": "C"},
                timeout=30)
        except subprocess.TimeoutExpired:
            raise RuntimeUnavailableError("the sandbox network was not set up within 30s") from None
        if proc.returncode != 0:
            why = " ".join(proc.stderr.split())[-600:] or f"exit status {proc.returncode}"
            load = (f"as root: modprobe {_MODULES} (a user namespace cannot load modules)"
                    if join_userns else f"modprobe {_MODULES}")
            raise RuntimeUnavailableError(
                f"the sandbox network could not be set up: {why}. It needs nftables with NAT "
                f"in the kernel ({load}) and the nft, ip and nsenter tools (apt-get install "
                "nftables iproute2 util-linux)")
        ours.settimeout(5)
        try:
            _, got, _, _ = socket.recv_fds(ours, 16, 2)
        except OSError as exc:
            raise RuntimeUnavailableError(
                f"the sandbox network helper sent no sockets: {exc}") from None
        if len(got) != 2:
            for fd in got:
                os.close(fd)
            raise RuntimeUnavailableError("the sandbox network helper sent no sockets")
        return (socket.socket(fileno=got[0]), socket.socket(fileno=got[1]))
    finally:
        ours.close()
        theirs.close()
        for fd in fds:
            os.close(fd)
