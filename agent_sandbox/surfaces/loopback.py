"""Is an address loopback? The rule every listener uses before it goes without auth."""

from __future__ import annotations

import functools
import ipaddress
import socket


@functools.lru_cache(maxsize=256)
def _literal_is_loopback(host: str) -> bool | None:
    """For an address literal, whether it is loopback (None: not a literal). Cached: the
    HTTP servers ask for every request's local address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1, or a name that resolves only to those."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    literal = _literal_is_loopback(host)
    if literal is not None:
        return literal
    try:  # a name: resolved every time (what it resolves to may change)
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in socket.getaddrinfo(host, None))
    except OSError:
        return False
