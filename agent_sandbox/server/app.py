"""The gateway's ASGI application: the engine's Provider methods as a REST API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI

from agent_sandbox import heap
from agent_sandbox.providers.base import Provider
from agent_sandbox.server import e2b, errors
from agent_sandbox.server.body_cap import BodyCap
from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.metrics import MetricsMiddleware
from agent_sandbox.server.routes import (
    code,
    commands,
    dirs,
    files,
    misc,
    ports,
    pty,
    sandboxes,
    watch,
)
from agent_sandbox.server.schemas import ErrorBody
from agent_sandbox.server.state import GatewayState
from agent_sandbox.settings import Settings

# Blocking engine calls run in worker threads; anyio's default of 40 would make the 41st
# concurrent command wait for a thread, not for the sandbox.
WORKER_THREADS = 256
_ERROR_DOCS = {status: {"model": ErrorBody, "description": what} for status, what in (
    (400, "invalid argument"), (401, "no or bad API key"),
    (403, "beyond a network ceiling (the gateway's or the API key's)"), (404, "not found"),
    (409, "wrong state"), (429, "quota exceeded (see Retry-After)"),
    (503, "runtime unavailable"), (504, "timeout"))}
_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def _documented(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI's OpenAPI document, told what the error handlers really answer: every
    error is an ErrorBody in JSON (also where the success is text, as on /metrics), and a
    malformed request is a 400, never the 422 FastAPI announces by default."""
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
        return app.openapi_schema  # type: ignore[return-value]

    return openapi


def create_app(engine: Provider | None = None, keys: KeyStore | None = None,
               settings: Settings | None = None) -> FastAPI:
    """The app over a provider (unless given: the embedded engine, or a cluster's Pods
    with ABX_ENGINE=kubernetes) and ``keys`` (made from ``settings`` when not given)."""
    settings = settings or Settings()
    if engine is None and settings.engine == "kubernetes":
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

    app = FastAPI(title="agent-sandbox gateway", version="1", lifespan=lifespan,
                  responses=_ERROR_DOCS)  # type: ignore[arg-type]
    app.state.gateway = state
    app.openapi = _documented(app)  # type: ignore[method-assign]
    errors.install(app)
    for module in (sandboxes, commands, code, files, dirs, watch, misc, pty, ports):
        app.include_router(module.router)
    app.include_router(ports.tcp_router)
    app.add_middleware(BodyCap)  # inside E2B's front: its API bounds its own bodies
    app.add_middleware(e2b.front, state=state)  # type: ignore[arg-type]
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    return app
