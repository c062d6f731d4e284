"""Billing's HTTP API: admin routes (mounted under /admin/v1 behind the admin token) and the Stripe webhook.

One router module per resource; `deps` holds the dependencies, `errors` the one mapping of
billing's domain errors to API errors. Bad input is a 400 (invalid_request_error), an unknown
id a 404, a state conflict (finalizing a running month, crediting a draft) a 409: never a 500.
`tenant_router` is the tenant-facing usage API (billing.api.tenant), for tenants' own API keys.
"""

from __future__ import annotations

from fastapi import APIRouter

from billing.api import (
    billing_profiles,
    budgets,
    credit_notes,
    credits,
    exchange_rates,
    invoice_documents,
    invoices,
    prices,
    spool,
    usage,
    webhooks,
)
from billing.api.tenant import invoices_router as tenant_invoices_router
from billing.api.tenant import router as tenant_router

admin_router = APIRouter(tags=["billing"])
for module in (
    *(usage, prices, budgets, credits, billing_profiles, invoices, invoice_documents, credit_notes),
    *(exchange_rates, spool),
):
    admin_router.include_router(module.router)

public_router = APIRouter(tags=["billing"])
public_router.include_router(webhooks.router)

__all__ = ["admin_router", "public_router", "tenant_invoices_router", "tenant_router"]
