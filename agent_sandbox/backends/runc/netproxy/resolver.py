"""Names to the addresses the proxy connects to: the operator's static hosts first, then
the host's resolver (bounded: a few lookups at once, each with a deadline, answers cached
briefly). Only addresses a sandbox may reach are ever connected to; a name that resolves
to none says why (Found.why_not)."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass

from agent_sandbox.backends.runc.netproxy.config import OPEN_RANGES_SETTING, ProxyConfig

TTL = 30.0
_LOOKUP_TIMEOUT = 5.0
_CHECK_TIMEOUT = 2.0
_MAX_CACHED = 4096
_FAILED_TTL = 5.0
_NAMED = 3  # addresses a refusal names at most
# getaddrinfo's "the name has no (IPv4) address" answers; the others are failures.
_NO_ADDRESS = {getattr(socket, e) for e in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY")
               if hasattr(socket, e)}


@dataclass(frozen=True)
class Found:
    """What a name resolves to on the host, split by what a sandbox may reach."""

    reachable: tuple[str, ...] = ()
    blocked: tuple[tuple[str, str], ...] = ()  # (address, why it is blocked)
    error: str = ""  # the lookup itself failed (not: the name has no address)

    def why_not(self, name: str, *, detail: bool = True) -> str:
        """Why the sandbox cannot reach ``name`` ("" if it can). ``detail``: name the
        addresses (the host's log always does; a ``full`` sandbox, which may ask for any
        name, is not told what the host's resolver knows about private ones)."""
        if self.reachable:
            return ""
        if self.error:
            return f"looking up {name} on the host failed: {self.error}"
        if not self.blocked:
            return f"{name} does not resolve on the host"
        if not detail:
            return (f"{name} resolves only to addresses a sandbox may not reach (private, "
                    "reserved or the host's own ranges; the host's proxy log names them); "
                    f"an operator can open a range with {OPEN_RANGES_SETTING}")
        named = self.blocked[:_NAMED]
        where = ", ".join(f"{a} ({why})" for a, why in named)
        more = f" and {len(self.blocked) - _NAMED} more" if len(self.blocked) > _NAMED else ""
        return (f"{name} resolves only to {where}{more}, which a sandbox may not reach: "
                "private, reserved and the host's own ranges are blocked. If that is really "
                f"{name} (a mirror, a filtering resolver), the operator can open it: "
                f"{OPEN_RANGES_SETTING}={','.join(f'{a}/32' for a, _ in named)}")


class Resolver:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._cache: dict[str, tuple[float, tuple[str, ...] | str]] = {}
        self._lookups = asyncio.Semaphore(8)

    async def addresses(self, name: str) -> tuple[str, ...]:
        """IPv4 addresses of ``name`` the sandbox may reach (empty: none, or unknown)."""
        return (await self.resolve(name)).reachable

    async def resolve(self, name: str) -> Found:
        """What ``name`` resolves to (IPv4), as the sandbox may use it. Never raises: a
        failed lookup is a Found with an error, not a dead connection."""
        found = self.config.hosts.get(name)
        if found is None:
            try:
                found = await self._lookup(name)
            except Exception as exc:  # noqa: BLE001 - a bug or a broken runtime: say so
                return Found(error=f"{type(exc).__name__}: {exc}"[:200])
            if isinstance(found, str):
                return Found(error=found)
        usable = [a for a in found if ":" not in a]
        return Found(reachable=tuple(a for a in usable if not self.config.is_blocked(a)),
                     blocked=tuple((a, self.config.blocking_range(a)) for a in usable
                                   if self.config.is_blocked(a)))

    async def check(self) -> None:
        """Look a name up the way every name is: proves, as the proxy's user, that the
        lookup machinery works (its thread pool, the resolver library, the modules they
        import on first use). Raises OSError saying what failed; no answer is fine."""
        try:
            await asyncio.wait_for(self._getaddrinfo("localhost"), _CHECK_TIMEOUT)
        except (TimeoutError, OSError, UnicodeError):
            return
        except Exception as exc:  # noqa: BLE001 - e.g. ModuleNotFoundError
            raise OSError(f"name lookups fail in the proxy: {type(exc).__name__}: "
                          f"{exc}") from None

    async def _getaddrinfo(self, name: str) -> tuple[str, ...]:
        infos = await asyncio.get_running_loop().getaddrinfo(
            name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
        return tuple(dict.fromkeys(str(i[4][0]) for i in infos))

    async def _lookup(self, name: str) -> tuple[str, ...] | str:
        """The host resolver's addresses for ``name``, or why the lookup failed (cached:
        answers for TTL, failures briefly)."""
        hit = self._cache.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        found: tuple[str, ...] | str
        try:
            async with self._lookups:
                found = await asyncio.wait_for(self._getaddrinfo(name), _LOOKUP_TIMEOUT)
        except socket.gaierror as exc:
            found = () if exc.errno in _NO_ADDRESS else f"{exc.strerror or exc}"
        except TimeoutError:
            found = f"no answer within {_LOOKUP_TIMEOUT:.0f}s"
        except (OSError, UnicodeError, ValueError) as exc:
            found = f"{type(exc).__name__}: {exc}"[:200]
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
        self._cache[name] = (time.monotonic() + (TTL if isinstance(found, tuple)
                                                 else _FAILED_TTL), found)
        return found
