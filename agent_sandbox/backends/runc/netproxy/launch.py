"""The policy proxy process of a networked sandbox: started per boot (each boot has a new
network namespace) and again for each policy change (the namespace's rules follow the
policy; the sandbox keeps running), stopped with the sandbox.

Its pid is kept in the sandbox's row; a pid read back is only ever signalled after
/proc/PID/cmdline shows it is still our proxy (pids are reused)."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import select
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import agent_sandbox
from agent_sandbox.backends.runc import supervisor
from agent_sandbox.backends.runc.host_paths import first_closed
from agent_sandbox.backends.runc.netproxy import config as proxy_config
from agent_sandbox.backends.runc.netproxy import namespace as netns
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core import network as netpolicy
from agent_sandbox.core.errors import InvalidArgumentError, RuntimeUnavailableError
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.service.secrets import SandboxSecrets

MODULE = "agent_sandbox.backends.runc.netproxy"
_PACKAGE_ROOT = str(Path(agent_sandbox.__file__).resolve().parent.parent)
_NOBODY = "65534:65534"
_LOG_MAX = 1 << 20
_READY_TIMEOUT = 15.0
# Pythons the root engine's proxy may run on when nobody cannot read the engine's own.
_OTHER_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def proxy_config_for(policy: NetworkPolicy, config: EngineConfig,
                     secrets: SandboxSecrets | None = None) -> proxy_config.ProxyConfig:
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
    upstream_ca = ""
    if secrets and config.secrets_upstream_ca:
        try:
            upstream_ca = Path(config.secrets_upstream_ca).read_text()
        except (OSError, UnicodeError) as exc:
            raise InvalidArgumentError(f"ABX_SECRETS_UPSTREAM_CA: cannot read "
                                       f"{config.secrets_upstream_ca}: {exc}") from None
    return proxy_config.ProxyConfig(policy=policy, blocked=tuple(netns.blocked_networks()),
                                    open_ranges=opened, hosts=hosts,
                                    secrets=tuple(secrets.secrets) if secrets else (),
                                    leaves=dict(secrets.leaves) if secrets else {},
                                    upstream_ca=upstream_ca)


def start(sandbox_dir: Path, pid: int, policy: NetworkPolicy, config: EngineConfig, *,
          join_userns: bool, secrets: SandboxSecrets | None = None) -> int:
    """Set up the netns of the container whose init is ``pid`` and start its proxy
    (with the sandbox's ``secrets``, if any); returns the proxy's pid once it serves."""
    settings = proxy_config_for(policy, config, secrets)
    path = sandbox_dir / "netproxy.json"
    proxy_config.write(path, settings)
    rules = netns.ruleset(65000, 65001, policy, settings.blocked, settings.open_ranges)
    rules = rules.replace(":65000", ":@TCP@").replace(":65001", ":@UDP@")
    tcp, udp = netns.setup(pid, rules, join_userns=join_userns)
    log = sandbox_dir / "netproxy.log"
    return _spawn(path, log, tcp, udp, proxy_runtime(), f"its log: {log}; ").pid


def _spawn(config_path: Path, log_path: Path, tcp: socket.socket, udp: socket.socket,
           runtime: Runtime, see: str = "") -> subprocess.Popen:
    """Start a proxy on ``tcp`` and ``udp`` (closed here) with the config at
    ``config_path``; returns once it serves. It says why not on its ready pipe (a
    RuntimeUnavailableError here, ``see`` added), not only in its log, which goes with
    the sandbox."""
    conf_fd = os.open(config_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    ready_r, ready_w = os.pipe()
    log = supervisor.open_log(log_path, _LOG_MAX)
    argv = [runtime.python, "-S", "-m", MODULE, "--tcp-fd", str(tcp.fileno()),
            "--udp-fd", str(udp.fileno()), "--config-fd", str(conf_fd),
            "--ready-fd", str(ready_w)]
    if os.geteuid() == 0:
        argv += ["--user", _NOBODY]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=proxy_env(), cwd="/", start_new_session=True,
                                pass_fds=(tcp.fileno(), udp.fileno(), conf_fd, ready_w))
    finally:
        for fd in (conf_fd, ready_w, log):
            os.close(fd)
        tcp.close()
        udp.close()
    try:
        ready, _, _ = select.select([ready_r], [], [], _READY_TIMEOUT)
        said = os.read(ready_r, 1024) if ready else b""
    finally:
        os.close(ready_r)
    if said != b"1":
        stop(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1.0)
        why = ("".join(c if c.isprintable() else "?" for c in said.decode(errors="replace"))
               if said else "it exited" if ready else f"no word in {_READY_TIMEOUT:.0f}s")
        raise RuntimeUnavailableError(f"the sandbox network proxy did not start: {why} "
                                      f"({see}abx doctor checks the proxy)")
    return proc


@dataclass(frozen=True)
class Probe:
    runtime: Runtime
    answers: dict[str, str]  # name -> "" (a sandbox may reach it) or why not


def probe(names: Sequence[str], policy: NetworkPolicy | str, config: EngineConfig, *,
          runtime: Runtime | None = None, timeout: float = 8.0) -> Probe:
    """Start a proxy the way ``start`` does (same Python, same user, same checks before
    it says it serves) on loopback sockets of the host instead of a sandbox's namespace,
    and ask its DNS server for ``names`` under ``policy``: what a sandbox would be told.
    ``abx doctor``'s network check. RuntimeUnavailableError if the proxy cannot start."""
    runtime = runtime or proxy_runtime()
    settings = proxy_config_for(netpolicy.parse(policy), config)
    with tempfile.TemporaryDirectory(prefix="abx-netproxy-") as tmp:
        path = Path(tmp) / "netproxy.json"
        proxy_config.write(path, settings)
        tcp = socket.create_server(("127.0.0.1", 0))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        proc = _spawn(path, Path(tmp) / "netproxy.log", tcp, udp, runtime)
        try:
            return Probe(runtime, _ask(port, names, timeout))
        finally:
            stop(proc.pid)
            proc.wait()


def _ask(port: int, names: Sequence[str], timeout: float) -> dict[str, str]:
    """Ask the DNS server at 127.0.0.1:``port`` for each name's A record at once."""
    import dns.edns
    import dns.message
    import dns.rcode

    pending: dict[int, str] = {}
    answers: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("127.0.0.1", port))
        for name in names:
            query = dns.message.make_query(name, "A", use_edns=0)
            while query.id in pending:
                query.id = (query.id + 1) % 65536
            pending[query.id] = name
            sock.send(query.to_wire())
        deadline = time.monotonic() + timeout
        while pending and (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            try:
                reply = dns.message.from_wire(sock.recv(4096))
            except Exception:  # noqa: BLE001 - dnspython raises many kinds; ask on
                continue
            name = pending.pop(reply.id, "")
            if not name:
                continue
            texts = [o.text for o in reply.options
                     if isinstance(o, dns.edns.EDEOption) and o.text]
            answers[name] = ("" if reply.rcode() == dns.rcode.NOERROR and reply.answer else
                             "; ".join(texts) or f"{name} does not resolve "
                             f"({dns.rcode.to_text(reply.rcode())})")
    for name in pending.values():
        answers[name] = f"the proxy did not answer for {name} within {timeout:.0f}s"
    return answers


# The Python the proxy runs on ------------------------------------------------------------
@dataclass(frozen=True)
class Runtime:
    """The interpreter the proxy runs on; ``note`` says why it is not the engine's own,
    or what is wrong with every choice (then ``readable`` is False: only what the proxy
    imports before it drops privileges stands between it and a failed lazy import)."""

    python: str
    note: str = ""
    readable: bool = True


def proxy_env() -> dict[str, str]:
    """The proxy's whole environment: it runs with -S (no site), so its imports come
    from this package and dnspython's directory, and the interpreter's standard library."""
    import dns

    roots = (_PACKAGE_ROOT, str(Path(dns.__file__).resolve().parent.parent))
    return {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8",
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(roots))}


def _root_only(path: str) -> bool:
    """Whether ``path`` exists and only root can change it or a directory above it: the
    root engine starts the proxy as root (a group-writable /usr/local/bin must not give
    its group a way in)."""
    target = Path(path).resolve()
    try:
        return all(st.st_uid == 0 and not st.st_mode & 0o022
                   for st in (p.stat() for p in (target, *target.parents)))
    except OSError:
        return False


def imports_as_nobody(python: str) -> str:
    """Why ``python``, started as the proxy's user, cannot import the proxy's whole module
    graph, the modules it imports on first use included ("" if it can)."""
    argv = [python, "-S", "-c", f"import {MODULE}.__main__ as m; m.preload()"]
    uid, gid = (int(x) for x in _NOBODY.split(":"))
    try:
        proc = subprocess.run(argv, env=proxy_env(), cwd="/", stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30, user=uid,
                              group=gid, extra_groups=[])
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    lines = proc.stderr.strip().splitlines()
    return "" if proc.returncode == 0 else (lines[-1] if lines else f"exit {proc.returncode}")


@functools.cache
def proxy_runtime() -> Runtime:
    """The engine's own Python if the proxy's user can read it (the root engine's proxy
    runs as nobody; a rootless one as the user), else the first of the host's that can
    import the proxy as nobody: a lazy import after the privilege drop otherwise fails
    (a venv made from a python under /root). Once per engine process; free when the
    engine's own is readable."""
    if os.geteuid() != 0:
        return Runtime(sys.executable)
    import dns

    uid, gid = (int(x) for x in _NOBODY.split(":"))
    own = [sysconfig.get_path("stdlib"), sysconfig.get_config_var("DESTSHARED") or "",
           str(Path(_PACKAGE_ROOT) / "agent_sandbox"), str(Path(dns.__file__).parent)]
    blocked = next((b for p in own if p and (b := first_closed(p, uid, gid, os.R_OK | os.X_OK))),
                   "")
    if not blocked:
        return Runtime(sys.executable)
    why = f"uid {uid} cannot read the engine's Python {sys.executable} ({blocked})"
    tried = []
    mine = os.path.realpath(sys.executable)
    for python in _OTHER_PYTHONS:
        if not _root_only(python) or os.path.realpath(python) == mine:
            continue
        problem = imports_as_nobody(python)
        if not problem:
            return Runtime(python, f"{why}: the proxy runs on {python}")
        tried.append(f"{python}: {problem}")
    others = "; ".join(tried) or "none found"
    return Runtime(sys.executable, f"{why}, nor another Python ({others}): the proxy runs "
                   "on it, with what it imports before dropping privileges; make the "
                   "engine's venv from a Python every user can read (/usr/bin/python3 -m "
                   "venv)", readable=False)


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
