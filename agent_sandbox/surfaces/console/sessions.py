"""Console sessions: an API key exchanged once for a random session token.

The token lives only in an HttpOnly, SameSite=Strict cookie; the process keeps its sha256
(a dump of this memory yields no usable cookie), the key's id, a CSRF token and when it
ends. Logout, the key's revocation or expiry end it: a copied cookie is then worthless.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

COOKIE = "abx_console"
TTL = 12 * 3600.0  # a sign-in lasts a working day at most
MOST = 10_000  # sessions kept; the oldest goes first beyond it
PER_KEY = 32  # a key's own sessions: its oldest goes first (it cannot push others' out)


@dataclass(frozen=True)
class Session:
    key_id: str
    csrf: str
    expires: float


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Sessions:
    def __init__(self, ttl: float = TTL, most: int = MOST, per_key: int = PER_KEY) -> None:
        self.ttl, self.most, self.per_key = ttl, most, per_key
        self._by_digest: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, key_id: str) -> tuple[str, Session]:
        token = secrets.token_urlsafe(32)
        session = Session(key_id, secrets.token_urlsafe(32), time.time() + self.ttl)
        with self._lock:
            mine = [d for d, s in self._by_digest.items() if s.key_id == key_id]
            for digest in mine[:max(0, len(mine) - self.per_key + 1)]:
                del self._by_digest[digest]
            self._by_digest[_digest(token)] = session
            while len(self._by_digest) > self.most:
                self._by_digest.popitem(last=False)
        return token, session

    def get(self, token: str) -> Session | None:
        digest = _digest(token)
        with self._lock:
            session = self._by_digest.get(digest)
            if session is not None and session.expires <= time.time():
                del self._by_digest[digest]
                return None
        return session

    def close(self, token: str) -> None:
        with self._lock:
            self._by_digest.pop(_digest(token), None)

    def close_key(self, key_id: str) -> None:
        """End every session of a key (it was revoked)."""
        with self._lock:
            for digest in [d for d, s in self._by_digest.items() if s.key_id == key_id]:
                del self._by_digest[digest]
