"""The shared daemon: the gateway on a unix socket, local users identified by the kernel.

``abx serve --unix /run/abx/abx.sock`` (run by root, usually as the systemd unit that
``abx daemon install`` writes). The socket is created ``0600`` and only then opened to
``root:abx 0660`` (never world-accessible, not even for an instant), a live daemon on the
same path is never replaced, and a stale socket file is. Every connection carries its
peer's credentials (``PeerCredProtocol``); ``PeerGuard`` refuses peers outside the group.
"""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from agent_sandbox.config.settings import Settings
from agent_sandbox.core.errors import InvalidArgumentError, RuntimeUnavailableError
from agent_sandbox.providers.choice import DAEMON_GROUP, DEFAULT_DAEMON_SOCKET, probe_daemon
from agent_sandbox.surfaces.http.keys import KeyStore

SOCKET_MODE = 0o660


def ensure_group(name: str) -> int:
    """The gid of ``name``, creating it as a system group when it is missing (root only)."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        pass
    if os.geteuid() != 0 or shutil.which("groupadd") is None:
        raise RuntimeUnavailableError(
            f"group {name!r} does not exist and cannot be created here (needs root and "
            f"groupadd): run `sudo groupadd --system {name}`")
    proc = subprocess.run(["groupadd", "--system", name], capture_output=True, text=True)
    if proc.returncode not in (0, 9):  # 9: created meanwhile by someone else
        raise RuntimeUnavailableError(f"groupadd {name} failed: {proc.stderr.strip()}")
    return grp.getgrnam(name).gr_gid


def bind_unix_socket(path: str | Path, group: str | None, mode: int = SOCKET_MODE
                     ) -> socket.socket:
    """A listening unix socket at ``path``, owned by ``group`` with ``mode``.

    As root the group is created if missing. Not as root, the socket is ``0600`` (only
    this user) unless ``group`` is one the user belongs to."""
    path = str(path)
    if len(os.fsencode(path)) >= 108:
        raise InvalidArgumentError(f"unix socket path too long (max 107 bytes): {path}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o755, exist_ok=True)
    if os.path.lexists(path):
        if probe_daemon(path) is None:
            raise InvalidArgumentError(f"another daemon already listens on {path}; stop it "
                                       "first (abx daemon status)")
        if not Path(path).is_socket():
            raise InvalidArgumentError(f"{path} exists and is not a socket; refusing to "
                                       "replace it")
        os.unlink(path)  # stale: its daemon died without cleaning up
    gid = -1
    if group:
        if os.geteuid() == 0:
            gid = ensure_group(group)
        else:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                gid = -1
            if gid not in os.getgroups():
                gid, mode = -1, 0o600
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # born 0600: nobody else can connect before the chmod
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    try:
        os.chown(path, -1, gid)
        os.chmod(path, mode)
        sock.listen(1024)
    except OSError:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return sock


@contextlib.contextmanager
def listening(path: str | Path, group: str | None, mode: int = SOCKET_MODE
              ) -> Iterator[socket.socket]:
    """The socket while serving; its file is removed afterwards if it is still ours."""
    sock = bind_unix_socket(path, group, mode)
    ident = os.stat(path).st_ino
    try:
        yield sock
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ident:
                os.unlink(path)


def serve_unix(path: str | Path = DEFAULT_DAEMON_SOCKET, *, group: str = DAEMON_GROUP,
               log_level: str = "warning", settings: Settings | None = None) -> None:
    """Run the daemon on ``path`` until interrupted (what ``abx serve --unix`` calls)."""
    import uvicorn

    from agent_sandbox.providers.select import use_settings
    from agent_sandbox.surfaces.gateway.app import create_app
    from agent_sandbox.surfaces.http.peercred import PeerCredProtocol, PeerGuard

    # The daemon is the engine: it must not itself point at a gateway or a daemon.
    settings = (settings or Settings()).model_copy(
        update={"sandbox_base_url": "", "engine": "auto"})
    use_settings(settings)
    keys = KeyStore(settings=settings)  # volume ownership lives there too
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler it found: ours ends the process through ``finally`` (the socket file goes).
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with listening(path, group) as sock:
            st = os.stat(path)
            print(f"abx daemon: serving local users on unix socket {path} (gid {st.st_gid}, "
                  f"mode {st.st_mode & 0o777:04o}; Ctrl-C stops it)", file=sys.stderr)
            app = PeerGuard(create_app(keys=keys, settings=settings), group)
            config = uvicorn.Config(app, http=PeerCredProtocol, log_level=log_level,
                                    timeout_keep_alive=30, timeout_graceful_shutdown=5)
            uvicorn.Server(config).run(sockets=[sock])
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Stopped(Exception):
    pass


def _stop(signum: int, frame: object) -> None:
    raise _Stopped(signum)
