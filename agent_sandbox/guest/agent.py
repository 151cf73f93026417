"""Guest agent: PID 1 inside every sandbox, serving exec and file operations.

Run as ``python3 -I -S /.abx/guest/agent.py --listen-fd 3`` (a listener the host made),
``--unix /run/abx/guest.sock`` or
``--tcp HOST:PORT`` (token from env ``ABX_GUEST_TOKEN``). Stdlib only, Python >= 3.9,
and it imports nothing from ``agent_sandbox``: it runs on the host's python3 through a
read-only mount (or a pod image's own python3), never on the package's environment.
Its modules, one job each, sit next to it and import each other by plain name (the
engine precompiles every ``*.py`` here): ``server`` (listeners, dispatch), ``conn``,
``process_ops`` / ``proc_table`` / ``proc`` (children), ``file_ops``, ``checks``
(request arguments), ``errors``, ``limits``, ``protocol`` (framing).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, List, Optional, Tuple

if __package__:
    from . import server
else:  # run as a script from /.abx/guest: -I drops the script dir from sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import server  # type: ignore[no-redef]


def _quiet_stdio() -> None:
    # The host reads our output only until we are ready, then closes its end.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


def _parse_args(argv: List[str]) -> Tuple[str, str]:
    # Hand-rolled: argparse costs several ms of startup.
    usage = "usage: agent.py (--listen-fd N | --unix PATH | --tcp HOST:PORT)"
    if len(argv) != 2 or argv[0] not in ("--listen-fd", "--unix", "--tcp"):
        sys.stderr.write(usage + "\n")
        raise SystemExit(2)
    return argv[0][2:], argv[1]


def _not_dumpable() -> None:
    """Make the guest untouchable from inside its sandbox.

    A non-dumpable process can be ptraced, or have its /proc/<pid>/mem and fds taken,
    only with CAP_SYS_PTRACE, which no sandbox process has. Programs the guest starts
    become dumpable again when they exec, so they can still be debugged.

    Without ctypes where it can (importing it is ~3 ms of every cold create): the kernel
    sets a process's dumpable flag to ``fs.suid_dumpable`` whenever its effective group
    id changes (prctl(2), commit_creds), and both 0 and 2 deny what CAP_SYS_PTRACE alone
    may do. So the effective gid is switched away and back; ids and capabilities end as
    they were. Anything else (the policy 1, no CAP_SETGID, no other gid mapped) uses prctl.
    """
    try:
        with open("/proc/sys/fs/suid_dumpable", "rb") as fh:
            policy = int(fh.read())
        egid = os.getegid()
        if policy in (0, 2):
            os.setegid(65534 if egid != 65534 else 0)
        else:
            policy = -1
    except (OSError, ValueError):
        policy = -1
    if policy != -1:
        os.setegid(egid)  # the saved gid is still egid: this cannot be refused
        return
    import ctypes

    pr_set_dumpable = 4
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no libc to call (exotic template): seccomp still guards pid 1


def _read_only(path: str) -> bool:
    """Is ``path`` on a read-only mount (a runc sandbox's ``/.abx/guest``)?"""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def new_agent(token: Optional[str], seal: bool = False) -> Any:
    """The agent; its later operations imported now unless its code is read-only (then,
    with ``seal``, pid 1's case, it imports nothing more)."""
    agent = server.Agent(token)
    if not _read_only(os.path.dirname(os.path.abspath(server.__file__))):
        agent.preload()
        if seal:
            # Nothing more from disk: the directories on the path are the sandbox's to
            # write (a Pod's guest code and python), so a module first needed later (or
            # a name a module imports on the fly) must fail rather than run here.
            sys.path[:] = []
            sys.path_importer_cache.clear()
    return agent


def main(argv: Optional[List[str]] = None) -> None:
    kind, where = _parse_args(sys.argv[1:] if argv is None else argv)
    token = os.environ.pop("ABX_GUEST_TOKEN", None) or None  # never leak it to children
    if kind == "tcp" and token is None:
        sys.stderr.write("abx-guest: --tcp requires the ABX_GUEST_TOKEN environment variable\n")
        raise SystemExit(2)
    # Untouchable from inside its sandbox: a non-dumpable process can be ptraced, or have
    # its memory and fds taken, only with CAP_SYS_PTRACE, which no sandbox process has.
    # Programs the guest starts become dumpable again when they exec.
    server.set_dumpable(False)
    threading.stack_size(1 << 20)  # many connection threads; default 8 MiB is wasteful
    # Every exec hands off between threads (pump, reaper, connection); the default 5 ms
    # GIL switch interval shows up directly in the round trip.
    sys.setswitchinterval(0.0002)
    agent = new_agent(token, seal=True)
    agent.parkable = kind == "listen-fd"
    listen = {"listen-fd": server.listen_fd, "unix": server.listen_unix,
              "tcp": server.listen_tcp}[kind]
    srv = listen(where)

    def on_term(signum: int, frame: Any) -> None:
        agent.table.kill_all()
        if kind == "unix":
            try:
                os.unlink(where)
            except OSError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    threading.Thread(target=agent.table.reap_forever, name="reaper", daemon=True).start()
    addr = srv.getsockname()
    shown = f"{addr[0]}:{addr[1]}" if kind == "tcp" else where
    sys.stdout.write(f"abx-guest ready {kind} {shown} pid={os.getpid()}\n")
    sys.stdout.flush()
    if kind == "listen-fd":
        _quiet_stdio()
    server.serve(agent, srv, kind == "tcp")


if __name__ == "__main__":
    main()
