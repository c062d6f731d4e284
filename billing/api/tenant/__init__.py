"""The tenant-facing API, for a tenant's own API keys (never the admin token): the usage API in
OpenAI's shape (/v1/organization/usage/completions, /v1/organization/costs) and OpenRouter's /v1/key.

kvgate/app.py mounts `router` behind the gateway's check for the "usage:read" scope (see deps),
and every query is scoped to the calling key's tenant.
"""

from __future__ import annotations

from fastapi import APIRouter

from billing.api.tenant import key, usage

router = APIRouter()
for module in (usage, key):
    router.include_router(module.router)

__all__ = ["router"]
