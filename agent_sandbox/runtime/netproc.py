"""The policy proxy process of a networked sandbox: started per boot (each boot has a new
network namespace) and again for each policy change (the namespace's rules follow the
policy; the sandbox keeps running), stopped with the sandbox.

Its pid is kept in the sandbox's row; a pid read back is only ever signalled after
/proc/PID/cmdline shows it is still our proxy (pids are reused)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent_sandbox.errors import InvalidArgumentError, RuntimeUnavailableError
from agent_sandbox.netpolicy import NetworkPolicy
from agent_sandbox.runtime import netns, supervisor
from agent_sandbox.runtime.config import EngineConfig
from agent_sandbox.runtime.netproxy import config as proxy_config

MODULE = "agent_sandbox.runtime.netproxy"
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)
_NOBODY = "65534:65534"
_LOG_MAX = 1 << 20
_READY_TIMEOUT = 15.0


def proxy_config_for(policy: NetworkPolicy, config: EngineConfig) -> proxy_config.ProxyConfig:
    """The proxy's configuration: the policy, what is always blocked (read now: the
    host's addresses change) and the operator's opened ranges and static names."""
    try:
        opened = tuple(ipaddress.ip_network(r, strict=False) for r in config.network_open_ranges)
    except ValueError as exc:
        raise InvalidArgumentError(f"ABX_NETWORK_OPEN_RANGES: {exc} (give CIDRs such as "
                                   "192.0.2.0/24, comma-separated)") from None
    hosts: dict[str, tuple[str, ...]] = {}
    for entry in config.network_hosts:
        name, _, address = entry.partition("=")
        try:
            ipaddress.IPv4Address(address.strip())
        except ValueError:
            raise InvalidArgumentError(f"ABX_NETWORK_HOSTS entry {entry!r} is not "
                                       "name=IPv4-address") from None
        key = name.strip().lower().rstrip(".")
        hosts[key] = (*hosts.get(key, ()), address.strip())
    return proxy_config.ProxyConfig(policy=policy, blocked=tuple(netns.blocked_networks()),
                                    open_ranges=opened, hosts=hosts)


def start(sandbox_dir: Path, pid: int, policy: NetworkPolicy, config: EngineConfig, *,
          join_userns: bool) -> int:
    """Set up the netns of the container whose init is ``pid`` and start its proxy;
    returns the proxy's pid once it serves."""
    settings = proxy_config_for(policy, config)
    path = sandbox_dir / "netproxy.json"
    proxy_config.write(path, settings)
    rules = netns.ruleset(65000, 65001, policy, settings.blocked, settings.open_ranges)
    rules = rules.replace(":65000", ":@TCP@").replace(":65001", ":@UDP@")
    tcp, udp = netns.setup(pid, rules, join_userns=join_userns)
    conf_fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    ready_r, ready_w = os.pipe()
    log = supervisor.open_log(sandbox_dir / "netproxy.log", _LOG_MAX)
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONPATH": _PACKAGE_ROOT}
    argv = [sys.executable, "-m", MODULE, "--tcp-fd", str(tcp.fileno()),
            "--udp-fd", str(udp.fileno()), "--config-fd", str(conf_fd),
            "--ready-fd", str(ready_w)]
    if os.geteuid() == 0:
        argv += ["--user", _NOBODY]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, cwd="/", start_new_session=True,
                                pass_fds=(tcp.fileno(), udp.fileno(), conf_fd, ready_w))
    finally:
        for fd in (conf_fd, ready_w, log):
            os.close(fd)
        tcp.close()
        udp.close()
    try:
        ready, _, _ = select.select([ready_r], [], [], _READY_TIMEOUT)
        if not ready or not os.read(ready_r, 1):
            stop(proc.pid)
            raise RuntimeUnavailableError("the sandbox's network proxy did not start; see "
                                          f"{sandbox_dir / 'netproxy.log'}")
    finally:
        os.close(ready_r)
    return proc.pid


def is_proxy(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return MODULE.encode() in argv[:4]


def stop(pid: int) -> None:
    """Kill the proxy and wait (a second at most) until it is gone, so its sockets are
    closed and what the sandbox does next is refused at once."""
    if not is_proxy(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while is_proxy(pid) and time.monotonic() < deadline:  # a zombie has no cmdline
        time.sleep(0.005)
