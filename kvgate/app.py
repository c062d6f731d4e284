"""The composition root: the one module that names every package and wires them together.

The gateway reaches billing only through its seam (gateway.billing_hooks); here billing's
hooks and routers are handed to it. `kvgate serve` serves create_app(); Alembic and the
drift tests take every package's tables from load_models().
"""

from __future__ import annotations

from fastapi import FastAPI
from sqlalchemy import MetaData

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
from web import models as web_models

# The modules that define tables; importing them registers their tables on Base.metadata.
TABLE_MODULES = (tenancy, responses_store, batch_models, billing_models, web_models)


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
    return app
