"""Per-sandbox access tokens for E2B's sandbox-addressed requests (envd, the code
interpreter, a sandbox's ports): the SDK gets the token from the control plane (the
API key's owner only) and sends it as ``X-Access-Token`` or ``E2B-Traffic-Access-Token``.

A token is an HMAC of the sandbox id under a secret of this gateway, so nothing is stored
per sandbox and a token still works after the gateway restarts. The secret lives in the
data dir, 0600 from birth."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.core.errors import InvalidArgumentError

SECRET_FILE = "e2b-token-secret"


class AccessTokens:
    def __init__(self, directory: str | Path) -> None:
        self._path = Path(directory) / SECRET_FILE
        self._secret: bytes | None = None

    def _key(self) -> bytes:
        if self._secret is None:
            self._secret = self._load()
        return self._secret

    def _load(self) -> bytes:
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
        except FileExistsError:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                secret = f.read(64)
            if len(secret) != 32:
                raise InvalidArgumentError(
                    f"{self._path} is not a token secret of this gateway (32 bytes): "
                    "delete it (every E2B access token given out so far stops working)"
                ) from None
            return secret
        secret = secrets.token_bytes(32)
        with os.fdopen(fd, "wb") as f:
            f.write(secret)
        return secret

    def for_sandbox(self, sandbox_id: str) -> str:
        digest = hmac.new(self._key(), sandbox_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def valid(self, sandbox_id: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(
            self.for_sandbox(sandbox_id).encode(), str(token).encode())

    def signed(self, sandbox_id: str, url: SignedUrl) -> bool:
        """Whether ``url``'s signature is the sandbox's: E2B's v1 file URL signature
        (``sha256(path:operation:user:token[:expiration])``, as its SDKs make it and
        envd checks it), its expiration not checked here."""
        parts = [url.path, url.operation, url.user, self.for_sandbox(sandbox_id)]
        if url.expiration is not None:
            parts.append(str(url.expiration))
        digest = hashlib.sha256(":".join(parts).encode()).digest()
        expected = "v1_" + base64.b64encode(digest).rstrip(b"=").decode()
        return hmac.compare_digest(expected.encode(), url.signature.encode())


@dataclass(frozen=True)
class SignedUrl:
    """A ``GET`` (read) or ``POST`` (write) of envd's ``/files`` authorized by its query
    (``download_url`` / ``upload_url`` of E2B's SDKs) rather than the access token."""

    signature: str
    path: str
    operation: str  # "read" or "write"
    user: str  # "" for the default user
    expiration: int | None  # Unix seconds

    def expired(self, now: float) -> bool:
        return self.expiration is not None and self.expiration < now
