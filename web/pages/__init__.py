"""The dashboard's pages: one module per page, each with its own router."""

from __future__ import annotations

from fastapi import APIRouter

from web.pages import (
    admin,
    alerts,
    billing_profile,
    cache,
    credit_notes,
    invoices,
    keys,
    login,
    overview,
    requests,
    usage,
)

router = APIRouter(include_in_schema=False)
for module in (admin, alerts, keys, login, overview, usage, cache, requests, invoices, credit_notes, billing_profile):
    router.include_router(module.router)
