"""The FastAPI application: routers, middleware, and a lifespan that wires the gateway together.

The gateway knows billing only through its seam (gateway.billing_hooks): kvgate.app, the
composition root, passes billing's hooks factory and routers in.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.api.deps import AdminDep
from gateway.api.errors import install_error_handlers
from gateway.api.main import api_router
from gateway.api.middleware import RequestContextMiddleware
from gateway.auth_cache import PrincipalCache
from gateway.backends.base import EngineClient
from gateway.backends.embedded import EmbeddedEngine
from gateway.billing_hooks import BillingHooks, NoBilling
from gateway.metrics import GatewayMetrics
from gateway.prompt import PromptRenderer
from gateway.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from gateway.services.server_state import ensure_admin_token, ensure_secret
from gateway.settings import GatewaySettings
from gateway.state import Gateway
from gateway.usage import DatabaseUsageRecorder, UsageRecorder
from kvgate import __version__
from kvgate.db import create_engine, session_factory

EngineFactory = Callable[[], EngineClient]
# Builds the billing hooks in the lifespan, once the database sessions exist.
BillingFactory = Callable[..., BillingHooks]


def _build_billing(
    billing_factory: BillingFactory | None,
    sessions: async_sessionmaker[AsyncSession],
    settings: GatewaySettings,
) -> BillingHooks:
    if billing_factory is None:
        return NoBilling()
    return billing_factory(sessions=sessions, settings=settings)


def create_app(
    settings: GatewaySettings | None = None,
    *,
    engine_factory: EngineFactory = EmbeddedEngine.from_settings,
    billing: BillingHooks | None = None,
    billing_factory: BillingFactory | None = None,
    admin_routers: Sequence[APIRouter] = (),
    public_routers: Sequence[APIRouter] = (),
    recorder: UsageRecorder | None = None,
    limiter: RateLimiter | None = None,
) -> FastAPI:
    """The gateway app. The engine is built and started by the lifespan, in the serving loop.

    `billing` is a ready BillingHooks (tests, benchmarks); otherwise `billing_factory(sessions=,
    settings=)` builds one in the lifespan; with neither, nothing is billed (NoBilling).
    `admin_routers` are mounted under /admin/v1 behind the admin token, `public_routers` as they are.
    The database must already be migrated (`kvgate serve` does it first).
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
        hooks = billing or _build_billing(billing_factory, sessions, settings)
        own_recorder = DatabaseUsageRecorder(settings.database_url) if recorder is None else None
        usage_recorder = recorder or own_recorder
        wrap = getattr(hooks, "wrap_recorder", None)
        if wrap is not None:
            usage_recorder = wrap(usage_recorder)
        rate_limiter = limiter or (RedisRateLimiter(settings.redis_url) if settings.redis_url else MemoryRateLimiter())
        gw = Gateway(
            settings=settings,
            engine=engine,
            renderer=PromptRenderer(apply_chat_template=engine.apply_chat_template, tokenizer=engine.tokenizer),
            sessions=sessions,
            limiter=rate_limiter,
            recorder=usage_recorder,
            billing=hooks,
            secret=secret,
            admin=admin,
            auth_cache=PrincipalCache(settings.auth_cache_ttl_s),
            metrics=GatewayMetrics(engine),
        )
        app.state.gateway = gw
        try:
            yield
        finally:
            await gw.drain()
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
    for router in admin_routers:
        app.include_router(router, prefix="/admin/v1", dependencies=[AdminDep])
    for router in public_routers:
        app.include_router(router)
    install_error_handlers(app)
    app.add_middleware(RequestContextMiddleware, max_body_bytes=settings.max_request_bytes)
    return app
