"""The package index a template is built from, and a quick check that it answers.

A build from an unreachable index must fail in seconds and say which index it tried, not
after pip's minutes of retries. The index is the one given (``--index-url``,
``ABX_TEMPLATE_INDEX_URL``), else pip's own (``PIP_INDEX_URL``, then its config files),
else PyPI. The check opens one TCP connection to it (or to the proxy pip would use),
bounded in time whatever DNS does.
"""

from __future__ import annotations

import configparser
import os
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path

PYPI = "https://pypi.org/simple"
PROBE_TIMEOUT = 3.0


def index_url(explicit: str = "") -> str:
    """The index pip will use."""
    return explicit.strip() or os.environ.get("PIP_INDEX_URL", "").strip() \
        or _from_pip_config() or PYPI


def _pip_config_files() -> list[Path]:
    """pip's config files, weakest first (global, user, then PIP_CONFIG_FILE)."""
    named = os.environ.get("PIP_CONFIG_FILE", "")
    if named == os.devnull:
        return []
    dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files = [Path(d) / "pip" / "pip.conf" for d in reversed(dirs) if d]
    files.append(Path("/etc/pip.conf"))
    home = Path(os.path.expanduser("~"))
    user_dir = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    files += [home / ".pip" / "pip.conf", Path(user_dir) / "pip" / "pip.conf"]
    if named:
        files.append(Path(named))
    return files


def _from_pip_config() -> str:
    found = ""
    for path in _pip_config_files():
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (OSError, configparser.Error):
            continue
        for section in ("global", "install"):  # install's own value wins
            for key in ("index-url", "index_url"):
                if parser.has_option(section, key):
                    found = parser.get(section, key).strip() or found
    return found


def _target(url: str) -> tuple[str, int] | None:
    """Where a connection to ``url`` goes: its host, or the proxy pip would use."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname):
        via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if via.hostname:
            return via.hostname, via.port or (443 if via.scheme == "https" else 80)
    try:
        port = parts.port
    except ValueError:
        return None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def unreachable(url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why ``url`` cannot be reached from here, or None when a connection opens."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = urllib.request.url2pathname(parts.path)
        return None if os.path.isdir(path) else f"{path} is not a directory"
    if parts.scheme not in ("http", "https"):
        return f"{parts.scheme or 'no'} scheme (use http, https or file)"
    target = _target(url)
    if target is None:
        return "no host in the URL"
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection(target, timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc) or type(exc).__name__)

    # getaddrinfo has no timeout of its own: a dead resolver must not hold the build.
    probe = threading.Thread(target=connect, name="abx-index-probe", daemon=True)
    probe.start()
    probe.join(timeout)
    if not outcome:
        return f"no answer from {target[0]}:{target[1]} within {timeout:.0f} s"
    reason = outcome[0]
    return None if reason is None else f"{target[0]}:{target[1]}: {reason}"
