"""``python -m agent_sandbox.backends.runc.netproxy --tcp-fd N --udp-fd M --config-fd C
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

from agent_sandbox.backends.runc.netproxy import config as proxy_config
from agent_sandbox.backends.runc.netproxy import dns_server
from agent_sandbox.backends.runc.netproxy.fake import FakeAddresses
from agent_sandbox.backends.runc.netproxy.log import Log
from agent_sandbox.backends.runc.netproxy.resolver import Resolver
from agent_sandbox.backends.runc.netproxy.tcp import MAX_RELAYS, TcpProxy


def preload() -> None:
    """Import now what is otherwise imported on first use: after the privilege drop the
    interpreter's own files may be out of reach (a python under /root, mode 0700). The
    engine runs the proxy on a Python its user can read when there is one
    (netproc.proxy_runtime, which also runs this as that user to prove it); this is the
    second line, and Resolver.check proves the lookup path once the drop is done."""
    import concurrent.futures.thread  # noqa: F401 - loop.getaddrinfo's thread pool
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


def _tell(args: argparse.Namespace, message: bytes) -> None:
    """Say ``b"1"`` (serving) or why not on the engine's ready pipe, once (the pipe is
    closed then, and its number may come back as a sandbox's connection)."""
    if args.ready_fd < 0:
        return
    with contextlib.suppress(OSError):  # the engine is gone
        os.write(args.ready_fd, message)
    with contextlib.suppress(OSError):
        os.close(args.ready_fd)
    args.ready_fd = -1


async def _serve(args: argparse.Namespace, log: Log) -> None:
    loop = asyncio.get_running_loop()
    resolver = Resolver(proxy_config.load(args.config_fd))
    await resolver.check()  # before saying ready: a proxy that cannot look names up fails
    fake = FakeAddresses()
    proxy = TcpProxy(resolver, fake, log)
    accepting = loop.create_task(proxy.serve(socket.socket(fileno=args.tcp_fd)))
    await dns_server.serve(loop, socket.socket(fileno=args.udp_fd), resolver, fake, log)
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    _tell(args, b"1")
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
        preload()
        if args.user:
            _drop_privileges(args.user)
        _harden()  # after the drop: a uid change makes a process dumpable again
        asyncio.run(_serve(args, log))
    except (OSError, ValueError) as exc:
        log.info(f"cannot serve: {exc}")
        _tell(args, f"cannot serve: {exc}"[:1000].encode(errors="replace"))
        return 1
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
