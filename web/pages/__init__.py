"""The dashboard's pages: one module per page, each with its own router."""

from __future__ import annotations

from fastapi import APIRouter

from web.pages import cache, invoices, overview, requests, usage

router = APIRouter(include_in_schema=False)
for module in (overview, usage, cache, requests, invoices):
    router.include_router(module.router)
