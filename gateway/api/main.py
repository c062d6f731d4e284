"""All routers, one per resource."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.routes import (
    admin_keys,
    admin_tenants,
    batches,
    chat_completions,
    completions,
    files,
    health,
    message_batches,
    messages,
    metrics,
    models,
    responses,
)

api_router = APIRouter()
for module in (
    *(messages, message_batches, chat_completions, responses, completions, batches, files, models),
    *(admin_tenants, admin_keys, health, metrics),
):
    api_router.include_router(module.router)
