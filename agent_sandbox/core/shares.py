"""Port share links: a URL a browser can open to reach a port of a sandbox through a
gateway, with no API key: a revocable, expiring token in the link, swapped for an
HttpOnly cookie on the first visit (docs/ports.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_SECONDS = 24 * 3600.0
MAX_SECONDS = 30 * 24 * 3600.0
MAX_PER_SANDBOX = 32


class PortShare(BaseModel):
    """A share link; ``url`` holds the token only in the answer that made it."""

    model_config = ConfigDict(frozen=True)

    share_id: str
    sandbox_id: str
    port: int
    public: bool = Field(False, description="no token needed (only where the operator "
                                            "allows public ports)")
    created_at: float
    expires_at: float
    url: str = Field("", description="open it in a browser (holds the token when just made)")
