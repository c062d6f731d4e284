"""All routers, one per resource."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.routes import (
    admin_keys,
    admin_tenants,
    chat_completions,
    completions,
    health,
    messages,
    metrics,
    models,
    responses,
)

api_router = APIRouter()
for module in (messages, chat_completions, responses, completions, models, admin_tenants, admin_keys, health, metrics):
    api_router.include_router(module.router)
