"""Running the gateway under uvicorn, and the rule for binding beyond loopback."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from agent_sandbox.errors import InvalidArgumentError
from agent_sandbox.server.keys import KeyStore


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


def check_bind(host: str, keys: KeyStore) -> None:
    """Refuse to expose an open gateway: beyond loopback, at least one live key."""
    if not is_loopback(host) and keys.live_keys() == 0:
        raise InvalidArgumentError(
            f"refusing to listen on {host}: no API key exists, so anyone who can reach it "
            "could run commands. Create one first (python -m agent_sandbox.server keys "
            "create --name NAME) or listen on 127.0.0.1")


def serve(host: str = "127.0.0.1", port: int = 8080, api_keys_file: str | Path | None = None,
          log_level: str = "warning") -> None:
    """Run the gateway until interrupted (what ``abx serve`` calls)."""
    import uvicorn

    from agent_sandbox.server.app import create_app

    if api_keys_file is not None:
        # The app and the key CLI find the same file through the environment.
        os.environ["ABX_GATEWAY_KEYS_FILE"] = str(api_keys_file)
    keys = KeyStore(api_keys_file)
    check_bind(host, keys)
    uvicorn.run(create_app(keys=keys), host=host, port=port, log_level=log_level,
                timeout_keep_alive=30)
