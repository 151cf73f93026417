"""The egress filter of ``network=True`` sandboxes: the internet only, never the host or
the LAN.

slirp4netns makes every connection of the sandbox from the host itself, so whatever the
host reaches the sandbox would reach: the host's own listeners (on any address, and on
slirp's gateway 10.0.2.2, which *is* the host), the LAN, cloud metadata
(169.254.169.254). Before slirp4netns brings tap0 up, the host installs an nftables
table in the container's network namespace (``install``) that rejects, at once, every
packet for those destinations: a TCP reset (ECONNREFUSED), else ICMP admin-prohibited
(the send itself fails, EPERM), never a silent drop that leaves a connect to time out.
Allowed: the sandbox's loopback interface (what leaves on lo comes back to the same
netns, never to tap0) and slirp's DNS forwarder (10.0.2.3, port 53).

The sandbox cannot change the rules: it has no CAP_NET_ADMIN (``oci.CAPABILITIES``, the
bounding set too) and seccomp refuses new user namespaces and setns. Each boot has a new
network namespace, so the engine installs the table on every start of the network. No
nft, or a kernel without nf_tables: ``network=True`` fails, it never runs unfiltered.

Rootless engine: the network namespace belongs to the container's user namespace, so
the user enters both (as the owner of that user namespace it holds CAP_NET_ADMIN there).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Iterable

from agent_sandbox.errors import RuntimeUnavailableError

TABLE = "abx_egress"
DNS = "10.0.2.3"  # slirp4netns' DNS forwarder: the one host-side service a sandbox uses
_TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_MODULES = "nf_tables nft_reject_inet"

# Never the internet: "this network", private, carrier-grade NAT, loopback, link-local
# (cloud metadata), IETF protocol assignments, documentation, benchmarking, multicast,
# reserved and broadcast.
BLOCKED_V4 = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
)
# Unspecified, loopback, IPv4-mapped, unique local, link-local, multicast.
BLOCKED_V6 = ("::/128", "::1/128", "::ffff:0:0/96", "fc00::/7", "fe80::/10", "ff00::/8")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _tool(name: str, package: str) -> str:
    path = shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_TOOLS_PATH}")
    if path is None:
        raise RuntimeUnavailableError(
            f"network=True needs {name} to keep the sandbox off the host and the LAN "
            f"(apt-get install {package}); without it no sandbox gets a network")
    return path


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


def _collapse(networks: Iterable[Network], version: int) -> list[str]:
    """Non-overlapping prefixes (an nft interval set refuses overlaps)."""
    same = [n for n in networks if n.version == version]
    return [str(n) for n in ipaddress.collapse_addresses(same)]


def ruleset(host: Iterable[Network]) -> str:
    """The nft script: replaces our table (atomically, one transaction)."""
    host = list(host)
    v4 = _collapse([*map(ipaddress.IPv4Network, BLOCKED_V4), *host], 4)
    v6 = _collapse([*map(ipaddress.IPv6Network, BLOCKED_V6), *host], 6)
    return f"""\
table inet {TABLE}
delete table inet {TABLE}
table inet {TABLE} {{
    set blocked4 {{
        type ipv4_addr; flags interval;
        elements = {{ {", ".join(v4)} }}
    }}
    set blocked6 {{
        type ipv6_addr; flags interval;
        elements = {{ {", ".join(v6)} }}
    }}
    chain output {{
        type filter hook output priority filter; policy accept;
        oifname "lo" accept
        ip daddr {DNS} meta l4proto {{ tcp, udp }} th dport 53 accept
        ip daddr @blocked4 meta l4proto tcp reject with tcp reset
        ip daddr @blocked4 reject with icmpx admin-prohibited
        ip6 daddr @blocked6 meta l4proto tcp reject with tcp reset
        ip6 daddr @blocked6 reject with icmpx admin-prohibited
    }}
}}
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


def install(pid: int, *, join_userns: bool) -> None:
    """Install the filter in the network namespace of the container whose init is
    ``pid`` (entering its user namespace first when the engine is not root: an ordinary
user's netns belongs to it); raises RuntimeUnavailableError when it cannot be installed."""
    nft = _tool("nft", "nftables")
    nsenter = _tool("nsenter", "util-linux")
    script = ruleset(host_networks())
    fds: list[int] = []
    try:
        try:
            fds.append(_open_ns(pid, "net"))
            if join_userns:
                fds.append(_open_ns(pid, "user"))
        except OSError as exc:
            raise RuntimeUnavailableError(
                f"cannot enter the sandbox's network namespace to filter it: {exc}") from None
        argv = nsenter_argv(nsenter, fds[0], fds[1] if join_userns else None)
        try:
            proc = subprocess.run([*argv, "--", nft, "-f", "-"], input=script,
                                  capture_output=True, text=True, pass_fds=tuple(fds),
                                  env={"PATH": _TOOLS_PATH, "LC_ALL": "C"}, timeout=30)
        except subprocess.TimeoutExpired:
            raise RuntimeUnavailableError("nft did not install the sandbox network filter "
                                          "within 30s") from None
    finally:
        for fd in fds:
            os.close(fd)
    if proc.returncode != 0:
        why = " ".join(proc.stderr.split())[-600:] or f"exit status {proc.returncode}"
        load = (f"as root: modprobe {_MODULES} (a user namespace cannot load kernel modules)"
                if join_userns else f"modprobe {_MODULES}")
        raise RuntimeUnavailableError(
            "network=True needs nftables to keep the sandbox off the host and the LAN, and "
            f"the filter could not be installed: {why}. The kernel needs nf_tables "
            f"(CONFIG_NF_TABLES, CONFIG_NFT_REJECT_INET; {load}) and the nft tool "
            "(apt-get install nftables)")
