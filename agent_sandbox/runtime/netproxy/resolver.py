"""Names to the addresses the proxy connects to: the operator's static hosts first, then
the host's resolver (bounded: a few lookups at once, each with a deadline, answers cached
briefly). Only addresses a sandbox may reach are ever returned."""

from __future__ import annotations

import asyncio
import socket
import time

from agent_sandbox.runtime.netproxy.config import ProxyConfig

TTL = 30.0
_LOOKUP_TIMEOUT = 5.0
_MAX_CACHED = 4096


class Resolver:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._cache: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._lookups = asyncio.Semaphore(8)

    async def addresses(self, name: str) -> tuple[str, ...]:
        """IPv4 addresses of ``name`` the sandbox may reach (empty: none, or unknown)."""
        found = self.config.hosts.get(name)
        if found is None:
            found = await self._lookup(name)
        return tuple(a for a in found if ":" not in a and not self.config.is_blocked(a))

    async def _lookup(self, name: str) -> tuple[str, ...]:
        hit = self._cache.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        loop = asyncio.get_running_loop()
        try:
            async with self._lookups:
                infos = await asyncio.wait_for(loop.getaddrinfo(
                    name, None, family=socket.AF_INET, type=socket.SOCK_STREAM),
                    _LOOKUP_TIMEOUT)
            found = tuple(dict.fromkeys(str(i[4][0]) for i in infos))
        except (TimeoutError, OSError, UnicodeError, ValueError):
            found = ()
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
        self._cache[name] = (time.monotonic() + TTL, found)
        return found
