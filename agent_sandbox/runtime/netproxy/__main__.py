"""``python -m agent_sandbox.runtime.netproxy --tcp-fd N --udp-fd M --config-fd C
--ready-fd R [--user UID:GID]``: serve one sandbox's network until killed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import resource
import signal
import socket
import sys

from agent_sandbox.runtime.netproxy import config as proxy_config
from agent_sandbox.runtime.netproxy import dns_server
from agent_sandbox.runtime.netproxy.fake import FakeAddresses
from agent_sandbox.runtime.netproxy.log import Log
from agent_sandbox.runtime.netproxy.resolver import Resolver
from agent_sandbox.runtime.netproxy.tcp import MAX_RELAYS, TcpProxy


def _warm_up() -> None:
    """Import now what is otherwise imported on first use: after the privilege drop the
    interpreter's own files may be out of reach (a python under /root)."""
    import encodings.idna  # noqa: F401 - names with non-ASCII labels

    dns_server.warm_up()
    asyncio.new_event_loop().close()


def _harden() -> None:
    """Not dumpable: another process of the same user (another sandbox's proxy) cannot
    ptrace this one; and room for MAX_RELAYS connections' descriptors."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * MAX_RELAYS if hard == resource.RLIM_INFINITY else min(hard, 4 * MAX_RELAYS)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))


def _drop_privileges(spec: str) -> None:
    """Root engine: the proxy needs no privilege to connect out; run it as nobody."""
    uid, gid = (int(x) for x in spec.split(":", 1))
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


async def _serve(args: argparse.Namespace, log: Log) -> None:
    loop = asyncio.get_running_loop()
    resolver = Resolver(proxy_config.load(args.config_fd))
    fake = FakeAddresses()
    proxy = TcpProxy(resolver, fake, log)
    accepting = loop.create_task(proxy.serve(socket.socket(fileno=args.tcp_fd)))
    await dns_server.serve(loop, socket.socket(fileno=args.udp_fd), resolver, fake, log)
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    os.write(args.ready_fd, b"1")
    os.close(args.ready_fd)
    log.info(f"serving, policy {resolver.config.policy.describe()}")
    # The accept loop only ends on a bug: then the process ends too (its sockets close and
    # the sandbox's connections are refused at once) rather than serve DNS alone.
    await asyncio.wait([stop, accepting], return_when=asyncio.FIRST_COMPLETED)
    if accepting.done() and not accepting.cancelled() and accepting.exception():
        raise OSError(f"the accept loop failed: {accepting.exception()!r}")
    accepting.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netproxy")
    parser.add_argument("--tcp-fd", type=int, required=True)
    parser.add_argument("--udp-fd", type=int, required=True)
    parser.add_argument("--config-fd", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--user", default="")
    args = parser.parse_args(argv)
    log = Log()
    try:
        if args.user:
            _warm_up()
            _drop_privileges(args.user)
        _harden()  # after the drop: a uid change makes a process dumpable again
        asyncio.run(_serve(args, log))
    except (OSError, ValueError) as exc:
        log.info(f"cannot serve: {exc}")
        return 1
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
