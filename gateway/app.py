"""The FastAPI application: routers, middleware, and a lifespan that wires the gateway together.

The gateway knows billing only through its seam (gateway.billing_hooks): kvgate.app, the
composition root, passes billing's hooks factory and routers in.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.admin_token_notice import announce_admin_token
from gateway.api.deps import AdminDep, require_scope
from gateway.api.docs import install_docs
from gateway.api.errors import install_error_handlers
from gateway.api.main import api_router
from gateway.api.middleware import RequestContextMiddleware
from gateway.api.route_templates import RouteTemplates
from gateway.api.schema import install_body_schemas
from gateway.auth_cache import PrincipalCache
from gateway.auth_invalidation import AuthInvalidation
from gateway.backends.base import EngineClient
from gateway.backends.factory import engine_client
from gateway.batches.runner import BatchRunner
from gateway.billing_hooks import BillingHooks, NoBilling
from gateway.cache_block_index import CacheBlockIndex
from gateway.cache_fingerprint_store import FingerprintStore
from gateway.inflight import InflightJournal, default_journal_dir
from gateway.metrics import GatewayMetrics
from gateway.prompt import PromptRenderer
from gateway.prompt_bounds import derive_bounds
from gateway.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from gateway.recovery import recover_interrupted
from gateway.request_workers import RequestWorkers, WorkerSetup
from gateway.services.completions import PrepareContext
from gateway.services.server_state import ensure_admin_token, ensure_secret
from gateway.settings import GatewaySettings
from gateway.shutdown import bounded, cleanup_budget_s, shut_down
from gateway.state import Gateway
from gateway.usage import DatabaseUsageRecorder, UsageRecorder
from kvgate import __version__
from kvgate.db import create_engine, session_factory
from kvgate.db_health import health_of

EngineFactory = Callable[[], EngineClient]
# Builds the billing hooks in the lifespan, once the database sessions exist.
BillingFactory = Callable[..., BillingHooks]

log = structlog.get_logger("kvgate.gateway")


def _build_billing(
    billing_factory: BillingFactory | None,
    sessions: async_sessionmaker[AsyncSession],
    settings: GatewaySettings,
) -> BillingHooks:
    if billing_factory is None:
        return NoBilling()
    return billing_factory(sessions=sessions, settings=settings)


def _metrics(app: FastAPI, engine: EngineClient, hooks: BillingHooks, registry: CollectorRegistry) -> GatewayMetrics:
    """The app's one registry: the gateway's and the engine's metrics, billing's when its hooks have some, and
    the engine pool's router's (attached before the engine started)."""
    billing_metrics = getattr(hooks, "metrics", None)
    return GatewayMetrics(
        engine,
        registry=registry,
        routes=RouteTemplates(app.routes),  # every router is included by now
        collectors=[billing_metrics] if billing_metrics is not None else [],
    )


async def recover_after_crash(
    *,
    hooks: BillingHooks,
    recorder: UsageRecorder,
    sessions: async_sessionmaker[AsyncSession],
    journal_dir: Path,
    metrics: GatewayMetrics | None = None,
) -> None:
    """Before serving: the requests a crashed process left in the journal get their records (gateway/recovery.py).

    Billing's spool is replayed first (when it has a replay_pending hook), so that a record
    spooled before the crash is in the database before recovery looks for it; with the
    database down, recovery's own records queue behind it in the spool, in the same order.
    """
    replay = getattr(hooks, "replay_pending", None)
    if replay is not None:
        await replay()
    await recover_interrupted(
        directory=journal_dir, recorder=recorder, billing=hooks, sessions=sessions, metrics=metrics
    )


def create_app(
    settings: GatewaySettings | None = None,
    *,
    engine_factory: EngineFactory | None = None,
    billing: BillingHooks | None = None,
    billing_factory: BillingFactory | None = None,
    admin_routers: Sequence[APIRouter] = (),
    public_routers: Sequence[APIRouter] = (),
    scoped_routers: Sequence[tuple[APIRouter, str]] = (),
    recorder: UsageRecorder | None = None,
    limiter: RateLimiter | None = None,
    prewarm_workers: bool = False,
) -> FastAPI:
    """The gateway app. The engine is built and started by the lifespan, in the serving loop.

    `billing` is a ready BillingHooks (tests, benchmarks); otherwise `billing_factory(sessions=,
    settings=)` builds one in the lifespan; with neither, nothing is billed (NoBilling).
    `admin_routers` are mounted under /admin/v1 behind the admin token, `public_routers` as they are,
    `scoped_routers` (router, scope) behind a tenant API key holding the scope, the caller's Principal
    left in request.state.principal (gateway.api.deps.require_scope).
    The database must already be migrated (`kvgate serve` does it first).
    prewarm_workers starts the request worker processes at start-up rather than on the first large body.
    Without `engine_factory` the engine is KVGATE_ENGINES' (gateway.backends.factory.engine_client).
    """
    settings = settings or GatewaySettings()
    make_engine = engine_factory or (lambda: engine_client(settings))

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
            announce_admin_token(new_token, settings)
        engine = make_engine()
        registry = CollectorRegistry(auto_describe=False)
        attach_metrics = getattr(engine, "attach_metrics", None)  # an engine pool's router counts on it
        if attach_metrics is not None:
            attach_metrics(registry)
        await engine.start()
        hooks = billing or _build_billing(billing_factory, sessions, settings)
        own_recorder = (
            DatabaseUsageRecorder(settings.database_url, write_timeout_s=settings.usage_write_timeout_s)
            if recorder is None
            else None
        )
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
        auth_cache = PrincipalCache(settings.auth_cache_ttl_s, stale_ttl_s=settings.auth_stale_ttl_s)
        invalidation = AuthInvalidation(auth_cache, settings.redis_url)
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
            auth_cache=auth_cache,
            metrics=_metrics(app, engine, hooks, registry),
            db_health=health_of(db),
            prep=prep,
            workers=workers,
            auth_invalidation=invalidation,
            fingerprints=FingerprintStore(
                ttl_s=settings.cache_diagnostics_ttl_s,
                per_tenant=settings.cache_diagnostics_per_tenant,
                redis_url=settings.redis_url,
            ),
            cache_index=CacheBlockIndex(
                blocks_per_tenant=settings.cache_explanation_blocks_per_tenant,
                tenants=settings.cache_explanation_tenants,
            ),
        )
        journal_dir = settings.inflight_journal_dir or default_journal_dir(settings.database_url)
        await recover_after_crash(
            hooks=hooks, recorder=usage_recorder, sessions=sessions, journal_dir=journal_dir, metrics=gw.metrics
        )
        if settings.inflight_journal:
            try:
                gw.journal = InflightJournal.open(journal_dir)
            except OSError as exc:
                raise RuntimeError(
                    f"cannot open the in-flight journal in {journal_dir}: {exc} "
                    "(set KVGATE_INFLIGHT_JOURNAL_DIR, or KVGATE_INFLIGHT_JOURNAL=false to run without it)"
                ) from exc
        invalidation.start()  # subscribes in the background; until then every key is checked in the database
        app.state.gateway = gw
        gw.batch_runner = BatchRunner(gw, concurrency=settings.batch_concurrency)
        gw.batch_runner.start()  # batches in progress resume (after the crash recovery above)
        # Connections pooled before an outage may have died with it: start afresh when it ends.
        gw.db_health.add_recovery_hook(lambda: db.sync_engine.dispose(close=False))
        if own_recorder is not None:
            gw.db_health.add_recovery_hook(own_recorder.drop_pooled_connections)
        # What start-up made (torch, transformers, the model, the app) lives as long as the server:
        # frozen, the collector's full passes stop rescanning its ~half a million objects, a pause
        # of tens of milliseconds on whichever request triggers one. Unfrozen again at shutdown.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            await bounded("batch_runner", gw.batch_runner.stop(), cleanup_budget_s(settings.shutdown_grace_s) / 3)
            closers: list[tuple[str, Callable[[], Awaitable[object]]]] = []
            if gw.journal is not None:
                closers.append(("inflight_journal", gw.journal.aclose))
            close = getattr(hooks, "aclose", None)
            if close is not None:
                closers.append(("billing", close))
            if own_recorder is not None:
                closers.append(("usage_recorder", own_recorder.aclose))
            closers.append(("auth_invalidation", invalidation.aclose))
            closers.append(("cache_fingerprints", gw.fingerprints.aclose))
            if isinstance(rate_limiter, RedisRateLimiter):
                closers.append(("rate_limiter", rate_limiter.close))
            closers.append(("database", db.dispose))
            try:
                await shut_down(gw, budget_s=cleanup_budget_s(settings.shutdown_grace_s), closers=closers)
            finally:
                gw.workers.close()
                gw.db_health.clear_recovery_hooks()

    app = FastAPI(
        title="kvgate",
        version=__version__,
        description="A multi-tenant prompt-caching LLM gateway: Anthropic Messages and OpenAI Chat Completions.",
        lifespan=lifespan,
        # The schema maps every route and field; it is served only when asked for, and its pages
        # with our own copy of their assets (gateway.api.docs), never FastAPI's CDN ones.
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if settings.expose_docs else None,
    )
    if settings.expose_docs:
        install_docs(app)
    app.include_router(api_router)
    for router in admin_routers:
        app.include_router(router, prefix="/admin/v1", dependencies=[AdminDep])
    for router in public_routers:
        app.include_router(router)
    for router, scope in scoped_routers:
        app.include_router(router, dependencies=[require_scope(scope)])
    install_error_handlers(app)
    install_body_schemas(app)
    app.add_middleware(
        RequestContextMiddleware, max_body_bytes=settings.max_request_bytes, body_timeout_s=settings.body_timeout_s
    )
    return app
