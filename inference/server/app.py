"""The engine server's FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from inference.async_engine import AsyncEngine
from inference.metrics import EngineMetrics
from inference.server.auth import require_engine_token
from inference.server.drain_routes import router as drain_router
from inference.server.errors import install_error_handlers
from inference.server.kv_routes import router as kv_router
from inference.server.routes import router
from inference.server.state import ServerState


def create_app(engine: AsyncEngine, *, shutdown_timeout_s: float | None = None) -> FastAPI:
    """An app serving engine with vLLM's OpenAI-compatible protocol.

    If the engine is not started yet, the app starts it on startup and shuts it down on
    shutdown (within shutdown_timeout_s, if given): it must run on the server's event
    loop, whose futures its handles resolve. An engine started by the caller is left for
    the caller to shut down.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        owned = engine.core is None
        if owned:
            await engine.start()
        try:
            yield
        finally:
            if owned:
                await engine.shutdown(timeout_s=shutdown_timeout_s)

    app = FastAPI(title="kvgate engine server", lifespan=lifespan)
    app.state.kvgate = ServerState(engine=engine, metrics=EngineMetrics(engine))
    install_error_handlers(app)
    token = engine.settings.engine_token
    if token is not None:
        app.middleware("http")(require_engine_token(token.get_secret_value()))
    app.include_router(router)
    app.include_router(kv_router)
    app.include_router(drain_router)
    return app
