"""Admin: revoke a key, under /admin/v1/keys."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from gateway.api.deps import AdminDep, GatewayDep, SessionDep
from gateway.api.responses import json_response
from gateway.protocols.admin import KeyOut
from gateway.services import keys

router = APIRouter(prefix="/admin/v1/keys", tags=["admin"], dependencies=[AdminDep])


@router.post("/{key_id}/revoke", response_model=KeyOut)
async def revoke_key(key_id: str, session: SessionDep, gw: GatewayDep) -> Response:
    key = await keys.revoke_key(session, key_id=key_id)
    gw.auth_cache.evict(key_id=key.id)
    return json_response(KeyOut.model_validate(key))
