"""Templates built on a gateway (``POST /v1/templates``): the recipe and its context (a
tar) sent, the build's events streamed back as they happen."""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError, SandboxError, error_from_code
from agent_sandbox.core.models import TemplateInfo
from agent_sandbox.remote.transport import Transport

MAX_CONTEXT = 12 << 20  # bytes of a context's tar: within the gateway's 16 MiB body as base64


def context_tar(folder: Path) -> bytes:
    """``folder`` as a gzipped tar (symlinks as links), refused over ``MAX_CONTEXT``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
            if buf.tell() > MAX_CONTEXT:
                raise InvalidArgumentError(
                    f"the build context {folder} is over {MAX_CONTEXT >> 20} MiB compressed: "
                    "a build through a gateway sends it whole; build on the gateway's host, "
                    "or fetch large files in a RUN")
    return buf.getvalue()


def build_recipe(provider: Any, name: str, recipe: str, *, context: str | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 **_: Any) -> TemplateInfo:
    """Build on the gateway (``POST /v1/templates``): ``context`` sent as a tar (links
    kept as links), the build's events to ``on_event`` as they happen. Other keywords
    (an engine's own: network, owner) are the gateway's to decide. A RemoteProvider
    method (``provider``: it, with its transport)."""
    http: Transport = provider._http
    body: dict[str, Any] = {"name": name, "recipe": recipe}
    if context:
        body["context_base64"] = base64.b64encode(context_tar(Path(context))).decode()
    outcome: dict[str, Any] = {}

    def each(event: dict[str, Any]) -> None:
        if event.get("type") == "result" or "error" in event:
            outcome.update(event)
        elif on_event is not None:
            on_event(event)

    http.ndjson("POST", "/v1/templates", each, json=body)
    if "error" in outcome:
        err = outcome["error"]
        raise error_from_code(err.get("code", "internal"), err.get("message", ""),
                              err.get("details"))
    if "template" not in outcome:
        raise SandboxError("the gateway ended the build's stream without its template")
    return TemplateInfo(**outcome["template"])
