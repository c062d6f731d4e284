"""The FastAPI application: routers, middleware, and a lifespan that wires the gateway together."""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.api.deps import AdminDep
from gateway.api.errors import install_error_handlers
from gateway.api.main import api_router
from gateway.api.middleware import RequestContextMiddleware
from gateway.api.schema import install_body_schemas
from gateway.auth_cache import PrincipalCache
from gateway.billing_hooks import BillingHooks, NoBilling
from gateway.engine import Engine
from gateway.metrics import GatewayMetrics
from gateway.prompt import PromptRenderer
from gateway.prompt_bounds import derive_bounds
from gateway.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from gateway.request_workers import RequestWorkers, WorkerSetup
from gateway.services.completions import PrepareContext
from gateway.services.server_state import ensure_admin_token, ensure_secret
from gateway.settings import GatewaySettings
from gateway.state import Gateway
from gateway.usage import DatabaseUsageRecorder, UsageRecorder
from kvgate import __version__
from kvgate.db import create_engine, session_factory

# Billing plugs in by defining create_billing_hooks(*, sessions, settings) -> BillingHooks here.
BILLING_HOOKS_MODULE = "billing.hooks"
# ...and its routes here: admin_router (mounted under /admin/v1 behind the admin token) and public_router.
BILLING_API_MODULE = "billing.api"

EngineFactory = Callable[[], Engine]

log = structlog.get_logger("kvgate.gateway")


def _default_engine() -> Engine:
    from inference.async_engine import AsyncEngine

    return AsyncEngine.from_settings()


def _discover_billing(sessions: async_sessionmaker[AsyncSession], settings: GatewaySettings) -> BillingHooks:
    try:
        module = importlib.import_module(BILLING_HOOKS_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in (BILLING_HOOKS_MODULE, BILLING_HOOKS_MODULE.split(".")[0]):
            raise
        return NoBilling()
    return module.create_billing_hooks(sessions=sessions, settings=settings)


def _include_billing_routes(app: FastAPI) -> None:
    try:
        module = importlib.import_module(BILLING_API_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in (BILLING_API_MODULE, BILLING_API_MODULE.split(".")[0]):
            raise
        return
    app.include_router(module.admin_router, prefix="/admin/v1", dependencies=[AdminDep])
    app.include_router(module.public_router)


def create_app(
    settings: GatewaySettings | None = None,
    *,
    engine_factory: EngineFactory = _default_engine,
    billing: BillingHooks | None = None,
    recorder: UsageRecorder | None = None,
    limiter: RateLimiter | None = None,
    prewarm_workers: bool = False,
) -> FastAPI:
    """The gateway app. The engine is built and started by the lifespan, in the serving loop.

    The database must already be migrated (`kvgate serve` does it first). prewarm_workers
    starts the request worker processes at start-up rather than on the first large body.
    """
    settings = settings or GatewaySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = create_engine(settings.database_url)
        sessions = session_factory(db)
        async with sessions() as session:
            secret = await ensure_secret(
                session, configured=settings.secret.get_secret_value() if settings.secret else None
            )
            admin, new_token = await ensure_admin_token(
                session, configured=settings.admin_token.get_secret_value() if settings.admin_token else None
            )
        if new_token:
            print(
                f"\nGenerated the admin token (shown once; only its hash is stored):\n  {new_token}\n"
                "Use it as `Authorization: Bearer <token>` on /admin/v1, or set KVGATE_ADMIN_TOKEN.\n",
                file=sys.stderr,
                flush=True,
            )
        engine = engine_factory()
        await engine.start()
        hooks = billing or _discover_billing(sessions, settings)
        own_recorder = DatabaseUsageRecorder(settings.database_url) if recorder is None else None
        usage_recorder = recorder or own_recorder
        wrap = getattr(hooks, "wrap_recorder", None)
        if wrap is not None:
            usage_recorder = wrap(usage_recorder)
        bounds = derive_bounds(
            tokenizer=engine.tokenizer,
            max_model_len=engine.max_model_len,
            apply_chat_template=engine.apply_chat_template,
        )
        if bounds.why_not:
            log.info("prompt_bounds_limited", reason=bounds.why_not)
        rate_limiter = limiter or (RedisRateLimiter(settings.redis_url) if settings.redis_url else MemoryRateLimiter())
        renderer = PromptRenderer(
            apply_chat_template=engine.apply_chat_template,
            tokenizer=engine.tokenizer,
            bounds=bounds,
            max_prompt_tokens=engine.max_model_len - 1,
        )
        prep = PrepareContext(engine.model_id, engine.max_model_len, settings.min_cacheable_tokens, renderer)
        workers = RequestWorkers(
            processes=settings.request_workers,
            setup=WorkerSetup(
                engine.tokenizer, engine.model_id, engine.max_model_len, settings.min_cacheable_tokens, bounds
            ),
        )
        if prewarm_workers:
            workers.prewarm()
        gw = Gateway(
            settings=settings,
            engine=engine,
            renderer=renderer,
            sessions=sessions,
            limiter=rate_limiter,
            recorder=usage_recorder,
            billing=hooks,
            secret=secret,
            admin=admin,
            auth_cache=PrincipalCache(settings.auth_cache_ttl_s),
            metrics=GatewayMetrics(engine),
            prep=prep,
            workers=workers,
        )
        app.state.gateway = gw
        try:
            yield
        finally:
            await gw.drain()
            gw.workers.close()
            close = getattr(hooks, "aclose", None)
            if close is not None:
                await close()
            await engine.shutdown()
            if own_recorder is not None:
                await own_recorder.aclose()
            if isinstance(rate_limiter, RedisRateLimiter):
                await rate_limiter.close()
            await db.dispose()

    app = FastAPI(
        title="kvgate",
        version=__version__,
        description="A multi-tenant prompt-caching LLM gateway: Anthropic Messages and OpenAI Chat Completions.",
        lifespan=lifespan,
    )
    app.include_router(api_router)
    _include_billing_routes(app)
    install_error_handlers(app)
    install_body_schemas(app)
    app.add_middleware(
        RequestContextMiddleware, max_body_bytes=settings.max_request_bytes, body_timeout_s=settings.body_timeout_s
    )
    return app
