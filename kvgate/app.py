"""The composition root: the one module that names every package and wires them together.

The gateway reaches billing only through its seam (gateway.billing_hooks); here billing's
hooks and routers are handed to it. `kvgate serve` serves create_app(); Alembic and the
drift tests take every package's tables from load_models().
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from sqlalchemy import MetaData

from alerts import models as alert_models
from alerts.delivery import Deliverer
from alerts.evaluator import AlertEvaluator
from alerts.settings import AlertSettings
from billing import api as billing_api
from billing import models as billing_models
from billing.hooks import create_billing_hooks
from gateway import app as gateway_app
from gateway import responses_store
from gateway.batches import models as batch_models
from gateway.billing_hooks import BillingHooks
from gateway.ratelimit import RateLimiter
from gateway.settings import GatewaySettings
from gateway.usage import UsageRecorder
from kvgate import tenancy
from kvgate.db import Base
from kvgate.tenancy import SCOPE_INVOICES_READ, SCOPE_USAGE_READ
from web import app as web_app
from web import mail as web_mail
from web import models as web_models

# The modules that define tables; importing them registers their tables on Base.metadata.
TABLE_MODULES = (tenancy, responses_store, batch_models, billing_models, web_models, alert_models)


def load_models() -> MetaData:
    """One metadata with every package's tables (for Alembic's autogenerate and the drift tests)."""
    return Base.metadata


def create_app(
    settings: GatewaySettings | None = None,
    *,
    engine_factory: gateway_app.EngineFactory | None = None,
    billing: BillingHooks | None = None,
    recorder: UsageRecorder | None = None,
    limiter: RateLimiter | None = None,
    prewarm_workers: bool = False,
) -> FastAPI:
    """The kvgate server: the gateway, billed by billing's hooks (or `billing`, for tests and
    benchmarks), with billing's admin routes under /admin/v1, its public routes (webhooks), its usage API
    behind API keys with the "usage:read" scope, its invoices API behind "invoices:read", and the dashboard."""
    app = gateway_app.create_app(
        settings,
        engine_factory=engine_factory,
        billing=billing,
        billing_factory=create_billing_hooks,
        admin_routers=(billing_api.admin_router,),
        public_routers=(billing_api.public_router,),
        scoped_routers=(
            (billing_api.tenant_router, SCOPE_USAGE_READ),
            (billing_api.tenant_invoices_router, SCOPE_INVOICES_READ),
        ),
        recorder=recorder,
        limiter=limiter,
        prewarm_workers=prewarm_workers,
    )
    web_app.install(app)
    install_alerts(app)
    return app


def install_alerts(app: FastAPI, settings: AlertSettings | None = None) -> None:
    """Run the alert evaluator in the server's lifespan, after the gateway's start-up (its database sessions
    exist then) and stopped before the gateway shuts down. Alert mail goes through the dashboard's SMTP code,
    with the dashboard's settings as they are at sending time."""
    settings = settings or AlertSettings()
    app.state.alert_settings = settings  # the Alerts page checks new endpoints against it
    inner = app.router.lifespan_context

    async def send(*, to: Sequence[str], subject: str, body: str) -> bool:
        return await web_mail.send_mail(app.state.web_settings, to=to, subject=subject, body=body)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        async with inner(app) as state:
            if not settings.alerts:
                yield state
                return
            sessions = app.state.gateway.sessions
            timeout_s, concurrency = settings.alerts_webhook_timeout_s, settings.alerts_concurrency
            deliverer = Deliverer(
                sessions,
                mail=send,
                timeout_s=timeout_s,
                concurrency=concurrency,
                allow_private=settings.alerts_allow_private_webhooks,
            )
            evaluator = AlertEvaluator(sessions, deliverer, interval_s=settings.alerts_interval_s)
            app.state.alert_evaluator = evaluator
            evaluator.start()
            try:
                yield state
            finally:
                await evaluator.aclose()

    app.router.lifespan_context = lifespan
