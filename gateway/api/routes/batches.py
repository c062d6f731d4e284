"""OpenAI Batch: POST /v1/batches, GET /v1/batches/{id}, GET /v1/batches, POST /v1/batches/{id}/cancel."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, Response

from gateway.api.body import read_body
from gateway.api.deps import ContextDep, GatewayDep
from gateway.batches import store
from gateway.batches.models import ENDED, ERRORS, OPENAI, OUTPUT, SUCCEEDED, Batch
from gateway.batches.runner import wake_runner
from gateway.batches.shapes import openai_batch
from gateway.batches.validate import OPENAI_ENDPOINTS, openai_items
from gateway.generation import admit_rate
from gateway.state import Gateway
from kvgate.errors import InvalidRequestError

router = APIRouter(prefix="/v1/batches", tags=["openai"])


async def _shaped(gw: Gateway, batches: list[Batch]) -> list[dict[str, Any]]:
    shaped = []
    async with gw.sessions() as session:
        counts = await store.item_counts(session, [b.id for b in batches])
        for batch in batches:
            c = counts[batch.id]
            files = await store.output_files(session, batch.id) if batch.status == ENDED else {}
            failed = batch.request_count - c.get(SUCCEEDED, 0)
            output = files[OUTPUT].id if OUTPUT in files and c.get(SUCCEEDED, 0) else None
            errors = files[ERRORS].id if ERRORS in files and failed else None
            shaped.append(openai_batch(batch, c, output_file_id=output, error_file_id=errors))
    return shaped


async def _one(gw: Gateway, tenant_id: str, batch_id: str) -> JSONResponse:
    async with gw.sessions() as session:
        batch = await store.get_batch(session, tenant_id=tenant_id, batch_id=batch_id, api=OPENAI)
    (shaped,) = await _shaped(gw, [batch])
    return JSONResponse(shaped)


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    extra = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
    if extra:
        raise InvalidRequestError(f"{extra[0]}: Unrecognized request argument supplied", param=extra[0])
    if body.get("endpoint") not in OPENAI_ENDPOINTS:
        raise InvalidRequestError(
            f"endpoint: {body.get('endpoint')!r} is not supported; use one of {', '.join(OPENAI_ENDPOINTS)}",
            param="endpoint",
        )
    if body.get("completion_window") != "24h":
        raise InvalidRequestError("completion_window: must be '24h'", param="completion_window")
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or any(
            not isinstance(k, str) or not isinstance(v, str) or len(k) > 64 or len(v) > 512 for k, v in metadata.items()
        )
    ):
        raise InvalidRequestError(
            "metadata: at most 16 string pairs (keys ≤ 64, values ≤ 512 characters)", param="metadata"
        )
    if not isinstance(body.get("input_file_id"), str):
        raise InvalidRequestError("input_file_id: Field required", param="input_file_id")
    return body


@router.post("")
async def create_batch(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx, counts_input_tokens=False)
    body = _body(await read_body(request, limit=1024 * 1024))
    tenant_id = ctx.principal.tenant_id
    async with gw.sessions() as session:
        file = await store.get_file(session, tenant_id=tenant_id, file_id=body["input_file_id"])
    if file.purpose != "batch" or file.content is None:
        raise InvalidRequestError(
            f"input_file_id: file {file.id} was not uploaded with purpose 'batch'", param="input_file_id"
        )
    items = openai_items(file.content, endpoint=body["endpoint"])
    batch = await store.create_batch(
        gw.sessions,
        batch_id=store.new_id("batch_"),
        tenant_id=tenant_id,
        api_key_id=ctx.principal.api_key_id,
        api=OPENAI,
        endpoint=body["endpoint"],
        items=items,
        input_file_id=file.id,
        completion_window="24h",
        metadata=body.get("metadata"),
    )
    wake_runner(gw)
    (shaped,) = await _shaped(gw, [batch])
    return JSONResponse(shaped, headers=rate.headers)


@router.get("")
async def list_batches(
    gw: GatewayDep, ctx: ContextDep, limit: int = Query(20, ge=1, le=100), after: str | None = None
) -> Response:
    async with gw.sessions() as session:
        batches, has_more = await store.list_batches(
            session, tenant_id=ctx.principal.tenant_id, api=OPENAI, limit=limit, after_id=after, before_id=None
        )
    data = await _shaped(gw, batches)
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


@router.get("/{batch_id}")
async def retrieve_batch(batch_id: str, gw: GatewayDep, ctx: ContextDep) -> Response:
    return await _one(gw, ctx.principal.tenant_id, batch_id)


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, gw: GatewayDep, ctx: ContextDep) -> Response:
    await store.cancel_batch(gw.sessions, tenant_id=ctx.principal.tenant_id, batch_id=batch_id, api=OPENAI)
    wake_runner(gw)
    return await _one(gw, ctx.principal.tenant_id, batch_id)
