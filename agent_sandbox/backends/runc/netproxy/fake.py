"""One address of FAKE_RANGE per name: what the sandbox's DNS answers, so the address a
connection goes to says which name it is for. Stable for a name (a hash, then the next
free slot), so an answer cached across a proxy restart usually still means the same name."""

from __future__ import annotations

import hashlib
import ipaddress

from agent_sandbox.backends.runc.netproxy.config import FAKE_RANGE

_NET = ipaddress.IPv4Network(FAKE_RANGE)
_SLOTS = _NET.num_addresses - 2  # not the network and broadcast addresses
MAX_NAMES = 65536  # then the table starts afresh (a sandbox asking for that many names)


class FakeAddresses:
    def __init__(self) -> None:
        self._by_name: dict[str, str] = {}
        self._by_address: dict[str, str] = {}

    def address_for(self, name: str) -> str:
        known = self._by_name.get(name)
        if known is not None:
            return known
        if len(self._by_name) >= MAX_NAMES:
            self._by_name.clear()
            self._by_address.clear()
        slot = int.from_bytes(hashlib.blake2s(name.encode()).digest()[:4], "big") % _SLOTS
        while True:
            address = str(_NET[1 + slot])
            if address not in self._by_address:
                break
            slot = (slot + 1) % _SLOTS
        self._by_name[name] = address
        self._by_address[address] = name
        return address

    def name_of(self, address: str) -> str | None:
        return self._by_address.get(address)


def is_fake(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in _NET
    except ValueError:
        return False
