"""Which engine this process uses, and why: the decision behind ``default_provider()``.

``ABX_ENGINE=embedded|rootless|daemon|remote|kubernetes|memory`` forces one
(``kubernetes`` and ``memory`` are never chosen automatically). Otherwise, in order:

1. ``ABX_SANDBOX_BASE_URL`` set → ``remote`` (a gateway; ``unix:///path`` is a daemon socket);
2. root → ``embedded`` (the engine in this process);
3. a reachable daemon socket (``ABX_DAEMON_SOCKET``, default ``/run/abx/abx.sock``;
   reachable = ``connect()`` succeeds) → ``daemon``;
4. unprivileged user namespaces work (``unshare --user --map-root-user true``) → ``rootless``
   (the engine in this process, as this user);
5. nothing → an error naming the fixes.

``choose_engine()`` never raises: ``abx doctor`` shows its ``kind``, ``reason`` and ``error``.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any

from agent_sandbox.config.settings import DEFAULT_DAEMON_SOCKET, Settings, SettingsError

DAEMON_GROUP = "abx"  # users in it may use the daemon
KINDS = ("embedded", "rootless", "daemon", "remote", "kubernetes", "memory")
__all__ = ["DAEMON_GROUP", "DEFAULT_DAEMON_SOCKET", "EngineChoice", "choose_engine",
           "daemon_socket", "probe_daemon"]


@dataclass(frozen=True)
class EngineChoice:
    """``kind`` is one of KINDS, or None when nothing works (then ``error`` says why)."""

    kind: str | None
    reason: str
    forced: bool = False
    # remote: the base URL; daemon: the socket path
    target: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def daemon_socket(settings: Settings | None = None) -> str:
    return (settings or Settings()).daemon_socket


def probe_daemon(path: str, timeout: float = 1.0) -> str | None:
    """None when a daemon accepts connections at ``path``; otherwise what went wrong."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except FileNotFoundError:
            return f"no daemon socket at {path}"
        except PermissionError:
            return (f"the daemon socket {path} exists but this user may not open it (not in "
                    "group abx)")
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                return f"nothing listens on {path} (the daemon is not running)"
            return f"cannot connect to {path}: {exc.strerror or exc}"
    return None


def userns_problem() -> str | None:
    """None when this user can create a user namespace (probed once per process).
    Imported on use: a client of a remote gateway loads nothing of the rootless engine."""
    from agent_sandbox.backends.runc.host.rootless_setup import userns_problem as probe

    return probe()


def _fix(daemon_note: str, userns_note: str) -> str:
    return (f"no sandbox engine is usable by this user: {daemon_note}; {userns_note}. "
            "Fix one of: ask an administrator to install the shared daemon "
            "(`sudo abx daemon install`) and add you to group abx (`sudo usermod -aG abx "
            "$USER`, then log in again); or enable unprivileged user namespaces (`sudo "
            "sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000`); "
            "or run as root. `abx doctor` checks each of these.")


def _forced(kind: str, settings: Settings) -> EngineChoice:
    root = os.geteuid() == 0
    if kind == "memory":
        return EngineChoice("memory", "ABX_ENGINE=memory (tests and development: no "
                            "isolation)", True)
    if kind == "kubernetes":
        from agent_sandbox.backends.kubernetes.config import cluster_problem

        problem = cluster_problem(settings)
        if problem:
            return EngineChoice(None, "ABX_ENGINE=kubernetes", True, error=(
                f"ABX_ENGINE=kubernetes cannot work: {problem} (docs/kubernetes.md)"))
        return EngineChoice("kubernetes", "ABX_ENGINE=kubernetes", True,
                            target=settings.k8s_namespace or None)
    if kind == "embedded":
        if not root:
            return EngineChoice(None, "ABX_ENGINE=embedded", True, error=(
                "ABX_ENGINE=embedded needs root (the embedded engine mounts overlays and runs "
                "runc as root); as this user use ABX_ENGINE=rootless or ABX_ENGINE=daemon, "
                "or unset ABX_ENGINE to choose automatically (`abx doctor` shows which works)"))
        return EngineChoice("embedded", "ABX_ENGINE=embedded", True)
    if kind == "rootless":
        if root:
            return EngineChoice(None, "ABX_ENGINE=rootless", True, error=(
                "ABX_ENGINE=rootless is for ordinary users; as root use the embedded engine "
                "(unset ABX_ENGINE or set ABX_ENGINE=embedded)"))
        problem = userns_problem()
        if problem:
            return EngineChoice(None, "ABX_ENGINE=rootless", True, error=(
                f"ABX_ENGINE=rootless cannot work: {problem}. Enable them (`sudo sysctl -w "
                "kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000`) or use "
                "the shared daemon (ABX_ENGINE=daemon, `sudo abx daemon install`); see "
                "`abx doctor`"))
        return EngineChoice("rootless", "ABX_ENGINE=rootless", True)
    if kind == "daemon":
        path = settings.daemon_socket
        problem = probe_daemon(path)
        if problem:
            return EngineChoice(None, "ABX_ENGINE=daemon", True, target=path, error=(
                f"ABX_ENGINE=daemon but {problem}. Start the daemon (`sudo abx daemon "
                "install`, or `sudo abx serve --unix " + path + "`), make sure you are in "
                "group abx (`sudo usermod -aG abx $USER`, then log in again), or point "
                "ABX_DAEMON_SOCKET at its socket; `abx doctor` shows the state"))
        return EngineChoice("daemon", "ABX_ENGINE=daemon", True, target=path)
    base_url = settings.sandbox_base_url
    if not base_url:
        return EngineChoice(None, "ABX_ENGINE=remote", True, error=(
            "ABX_ENGINE=remote needs ABX_SANDBOX_BASE_URL (and ABX_SANDBOX_API_KEY)"))
    return EngineChoice("remote", "ABX_ENGINE=remote", True, target=base_url)


def choose_engine(settings: Settings | None = None) -> EngineChoice:
    """The engine this process would use now with ``settings`` (probes; never raises: a
    bad ABX_ENGINE is refused when the settings are loaded)."""
    if settings is None:
        try:
            settings = Settings()
        except SettingsError as exc:
            return EngineChoice(None, "invalid settings", True, error=exc.message)
    if settings.engine != "auto":
        return _forced(settings.engine, settings)
    base_url = settings.sandbox_base_url
    if base_url:
        return EngineChoice("remote", "ABX_SANDBOX_BASE_URL is set", target=base_url)
    if os.geteuid() == 0:
        return EngineChoice("embedded", "running as root")
    path = settings.daemon_socket
    daemon_note = probe_daemon(path)
    if daemon_note is None:
        return EngineChoice("daemon", f"not root; the abx daemon answers at {path}",
                            target=path)
    userns_note = userns_problem()
    if userns_note is None:
        return EngineChoice("rootless", f"not root; {daemon_note}; unprivileged user "
                            "namespaces work")
    return EngineChoice(None, "not root", error=_fix(daemon_note, userns_note))
