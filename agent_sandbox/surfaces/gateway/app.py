"""The gateway's ASGI application: the engine's Provider methods as a REST API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline

from agent_sandbox.config.settings import Settings
from agent_sandbox.core.provider import Provider
from agent_sandbox.surfaces import e2b, heap
from agent_sandbox.surfaces.console import app as console
from agent_sandbox.surfaces.http import errors
from agent_sandbox.surfaces.http.body_cap import BodyCap
from agent_sandbox.surfaces.http.keys import KeyStore
from agent_sandbox.surfaces.http.metrics import MetricsMiddleware
from agent_sandbox.surfaces.http.shares import ShareStore
from agent_sandbox.surfaces.http.state import GatewayState
from agent_sandbox.surfaces.rest.routes import (
    code,
    commands,
    dirs,
    files,
    misc,
    ports,
    previews,
    pty,
    sandboxes,
    secrets,
    snapshots,
    templates,
    watch,
)
from agent_sandbox.surfaces.rest.routes.deps import known_query
from agent_sandbox.surfaces.rest.schemas import ErrorBody

# Blocking engine calls run in worker threads; anyio's default of 40 would make the 41st
# concurrent command wait for a thread, not for the sandbox.
WORKER_THREADS = 256
_ERROR_DOCS = {status: {"model": ErrorBody, "description": what} for status, what in (
    (400, "invalid argument"), (401, "no or bad API key"),
    (403, "beyond a network ceiling (the gateway's or the API key's)"), (404, "not found"),
    (409, "wrong state"), (412, "a conditional write found the file at another version"),
    (423, "the file is being written or is locked by another task (see Retry-After)"),
    (429, "quota exceeded (see Retry-After)"),
    (503, "runtime unavailable"), (504, "timeout"))}
_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def _documented(app: FastAPI, provider: Provider) -> Callable[[], dict[str, Any]]:
    """FastAPI's OpenAPI document, told what the error handlers really answer: every
    error is an ErrorBody in JSON (also where the success is text, as on /metrics), and a
    malformed request is a 400, never the 422 FastAPI announces by default; and the most a
    sandbox may have here (the spec states its own bound, the backend may give less)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build()
            for operations in spec["paths"].values():
                for operation in operations.values():
                    responses = operation["responses"]
                    responses.pop("422", None)
                    for status, response in responses.items():
                        if status[0] in "45":
                            response["content"] = _ERROR_CONTENT
            schemas = spec.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            caps = getattr(provider, "limit_caps", None)
            create = schemas.get("CreateSpec", {}).get("properties", {})
            for name, (most, why) in (caps() if caps else {}).items():
                for branch in create.get(name, {}).get("anyOf", []):
                    if branch.get("type") in ("number", "integer"):
                        branch["maximum"] = most
                        create[name]["description"] += f" (here at most {most}: {why})"
        return app.openapi_schema  # type: ignore[return-value]

    return openapi


def create_app(engine: Provider | None = None, keys: KeyStore | None = None,
               settings: Settings | None = None) -> FastAPI:
    """The app over a provider (unless given: the embedded engine, or a cluster's Pods
    with ABX_ENGINE=kubernetes) and ``keys`` (made from ``settings`` when not given)."""
    settings = settings or Settings()
    if engine is None and settings.engine in ("kubernetes", "memory"):
        from agent_sandbox.providers.select import default_provider

        engine = default_provider(settings)
    if engine is None:
        from agent_sandbox.providers.local import local_provider

        engine = local_provider(settings)
    state = GatewayState(provider=engine, keys=keys or KeyStore(settings=settings),
                         network_ceiling=settings.gateway_ceiling)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS
        heap.settle()
        yield

    # /docs and /redoc from files of the package fastapi-offline (under /docs/assets), not
    # from a CDN: they work offline and load nothing from elsewhere; no validator either.
    app = FastAPIOffline(title="agent-sandbox gateway", version="1", lifespan=lifespan,
                         responses=_ERROR_DOCS, static_url="/docs/assets",
                         swagger_ui_parameters={"validatorUrl": None})
    app.state.gateway = state
    app.openapi = _documented(app, engine)  # type: ignore[method-assign]
    errors.install(app)
    for module in (sandboxes, commands, code, files, dirs, watch, misc, pty, secrets,
                   snapshots, templates):
        app.include_router(module.router, dependencies=[Depends(known_query)])
    app.include_router(ports.router)  # a port's query is the sandbox server's to read
    app.include_router(ports.tcp_router)
    app.include_router(previews.router, dependencies=[Depends(known_query)])
    app.include_router(previews.browser)  # a page's query is the sandbox server's to read
    shown = previews.Previews(ShareStore(state.keys.path.parent / "port-shares.db"),
                              public_ports=settings.gateway_public_ports,
                              preview_url=settings.gateway_preview_url)
    app.state.previews = shown
    # /ui, its session cookie for the routes above, and the REST calls' audit records.
    console.install(app, state, settings.mcp_audit_log)
    app.add_middleware(BodyCap)  # inside E2B's front: its API bounds its own bodies
    app.add_middleware(e2b.front, state=state)  # type: ignore[arg-type]
    if shown.preview_url:  # before E2B's routing of the same host names
        app.add_middleware(previews.PreviewHosts, shown=shown, state=state)  # type: ignore[arg-type]
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    return app
