"""GET /v1/models: the served model, in OpenAI's shape or, given anthropic-version, Anthropic's."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.responses import json_response
from gateway.protocols.openai import ModelCard, ModelList
from kvgate.errors import NotFoundError

router = APIRouter(prefix="/v1/models", tags=["models"])

_CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def _anthropic_card(model_id: str) -> dict[str, str]:
    return {"type": "model", "id": model_id, "display_name": model_id, "created_at": _CREATED.isoformat()}


@router.get("", response_model=ModelList)
async def list_models(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    model_id = gw.engine.model_id
    if "anthropic-version" in request.headers:
        return JSONResponse(
            {"data": [_anthropic_card(model_id)], "has_more": False, "first_id": model_id, "last_id": model_id}
        )
    return json_response(ModelList(data=[ModelCard(id=model_id, created=int(_CREATED.timestamp()))]))


@router.get("/{model_id:path}", response_model=ModelCard)
async def get_model(model_id: str, request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    if model_id != gw.engine.model_id:
        raise NotFoundError(f"model: {model_id}")
    if "anthropic-version" in request.headers:
        return JSONResponse(_anthropic_card(model_id))
    return json_response(ModelCard(id=model_id, created=int(_CREATED.timestamp())))
