"""envd, E2B's in-sandbox API, served by the gateway from our engine and guest (E2B's own
envd never runs): the Process and Filesystem Connect services of its published .proto files
(generated into ``envd_pb``), plus ``/files`` and ``/health``."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_sandbox.surfaces.e2b.routing import ASGIApp

# The envd version the gateway answers as (a sandbox's and a template's envdVersion): the
# SDKs switch features on by it (e2b/envd/versions.py, js-sdk src/envd/versions.ts), and
# every gate up to this one is served: file metadata (0.6.2), entries in watch events
# (0.6.3), watches allowed on network mounts (0.6.4); with it, symlinks are entries of
# their targets' type with the resolved path, as envd >= 0.6 lists them.
VERSION = "0.6.4"


async def _health(_: Request) -> Response:
    return Response(status_code=204)


def _grpc(scope: dict[str, Any]) -> bool:
    kind = dict(scope.get("headers", ())).get(b"content-type", b"").lower()
    return kind.startswith(b"application/grpc") and not kind.startswith(b"application/grpc-web")


def application() -> ASGIApp:
    from agent_sandbox.surfaces.e2b.envd import files, filesystem, process

    services = {"/process.Process/": process.application(),
                "/filesystem.Filesystem/": filesystem.application()}
    rest = Starlette(routes=[Route("/health", _health, methods=["GET"]), *files.routes])

    async def envd(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        for prefix, service in services.items():
            if path.startswith(prefix) and _grpc(scope):
                # connectrpc fails (a 500, a traceback) on gRPC: uvicorn has no trailers.
                await Response('{"code": "unimplemented", "message": "gRPC is not served '
                               'here: use Connect (what E2B\'s SDKs speak) or gRPC-Web"}',
                               415, media_type="application/json")(scope, receive, send)
                return
            if path.startswith(prefix):
                await service(scope, receive, send)
                return
        await rest(scope, receive, send)

    return envd
