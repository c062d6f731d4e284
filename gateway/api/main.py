"""All routers, one per resource."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.routes import admin_keys, admin_tenants, chat_completions, health, messages, metrics, models

api_router = APIRouter()
for module in (messages, chat_completions, models, admin_tenants, admin_keys, health, metrics):
    api_router.include_router(module.router)
