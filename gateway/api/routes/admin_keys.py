"""Admin: revoke a key or change its scopes, under /admin/v1/keys."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from gateway.api.deps import AdminDep, GatewayDep, SessionDep
from gateway.api.responses import json_response
from gateway.protocols.admin import KeyOut, KeyScopesUpdate
from gateway.services import keys

router = APIRouter(prefix="/admin/v1/keys", tags=["admin"], dependencies=[AdminDep])


@router.post("/{key_id}/revoke", response_model=KeyOut)
async def revoke_key(key_id: str, session: SessionDep, gw: GatewayDep) -> Response:
    key = await keys.revoke_key(session, key_id=key_id)
    await gw.evict_principals(key_id=key.id)
    return json_response(KeyOut.model_validate(key))


@router.patch("/{key_id}", response_model=KeyOut)
async def update_key(key_id: str, body: KeyScopesUpdate, session: SessionDep, gw: GatewayDep) -> Response:
    key = await keys.set_scopes(session, key_id=key_id, scopes=body.scopes)
    await gw.evict_principals(key_id=key.id)  # the new scopes apply to the next request
    return json_response(KeyOut.model_validate(key))
