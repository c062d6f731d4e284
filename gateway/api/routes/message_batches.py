"""Anthropic Message Batches: /v1/messages/batches (create, retrieve, list, cancel, results, delete)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.api.body import read_body
from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.routes.messages import known_betas
from gateway.batches import store
from gateway.batches.models import ANTHROPIC, ENDED, Batch
from gateway.batches.runner import wake_runner
from gateway.batches.shapes import message_batch
from gateway.batches.validate import anthropic_items
from gateway.generation import admit_rate
from gateway.state import Gateway
from kvgate.errors import InvalidRequestError

router = APIRouter(prefix="/v1/messages/batches", tags=["anthropic"], dependencies=[Depends(known_betas)])


def _results_url(request: Request, batch_id: str) -> str:
    return f"{str(request.base_url).rstrip('/')}/v1/messages/batches/{batch_id}/results"


async def _shaped(gw: Gateway, request: Request, batches: list[Batch]) -> list[dict[str, Any]]:
    async with gw.sessions() as session:
        counts = await store.item_counts(session, [b.id for b in batches])
    return [message_batch(b, counts[b.id], results_url=_results_url(request, b.id)) for b in batches]


async def _one(gw: Gateway, request: Request, tenant_id: str, batch_id: str) -> JSONResponse:
    async with gw.sessions() as session:
        batch = await store.get_batch(session, tenant_id=tenant_id, batch_id=batch_id, api=ANTHROPIC)
    (shaped,) = await _shaped(gw, request, [batch])
    return JSONResponse(shaped)


@router.post("")
async def create_message_batch(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx, counts_input_tokens=False)
    raw = await read_body(request, limit=gw.settings.max_request_bytes)
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"the body is not valid JSON: {exc}") from None
    items = anthropic_items(body)
    batch = await store.create_batch(
        gw.sessions,
        batch_id=store.new_id("msgbatch_"),
        tenant_id=ctx.principal.tenant_id,
        api_key_id=ctx.principal.api_key_id,
        api=ANTHROPIC,
        endpoint="/v1/messages",
        items=items,
    )
    wake_runner(gw)
    (shaped,) = await _shaped(gw, request, [batch])
    return JSONResponse(shaped, headers=rate.headers)


@router.get("")
async def list_message_batches(
    request: Request,
    gw: GatewayDep,
    ctx: ContextDep,
    limit: int = Query(20, ge=1, le=1000),
    after_id: str | None = None,
    before_id: str | None = None,
) -> Response:
    async with gw.sessions() as session:
        batches, has_more = await store.list_batches(
            session,
            tenant_id=ctx.principal.tenant_id,
            api=ANTHROPIC,
            limit=limit,
            after_id=after_id,
            before_id=before_id,
        )
    data = await _shaped(gw, request, batches)
    return JSONResponse(
        {
            "data": data,
            "has_more": has_more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


@router.get("/{batch_id}")
async def retrieve_message_batch(batch_id: str, request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    return await _one(gw, request, ctx.principal.tenant_id, batch_id)


@router.post("/{batch_id}/cancel")
async def cancel_message_batch(batch_id: str, request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    await store.cancel_batch(gw.sessions, tenant_id=ctx.principal.tenant_id, batch_id=batch_id, api=ANTHROPIC)
    wake_runner(gw)
    return await _one(gw, request, ctx.principal.tenant_id, batch_id)


@router.delete("/{batch_id}")
async def delete_message_batch(batch_id: str, gw: GatewayDep, ctx: ContextDep) -> Response:
    async with gw.sessions() as session:
        batch = await store.get_batch(session, tenant_id=ctx.principal.tenant_id, batch_id=batch_id, api=ANTHROPIC)
        if batch.status != ENDED:
            raise InvalidRequestError(f"Batch {batch_id} cannot be deleted while it is {batch.status}; cancel it first")
        await store.delete_batch(session, batch)
    return JSONResponse({"id": batch_id, "type": "message_batch_deleted"})


@router.get("/{batch_id}/results")
async def message_batch_results(batch_id: str, gw: GatewayDep, ctx: ContextDep) -> Response:
    async with gw.sessions() as session:
        batch = await store.get_batch(session, tenant_id=ctx.principal.tenant_id, batch_id=batch_id, api=ANTHROPIC)
    if batch.status != ENDED:
        raise InvalidRequestError(f"Batch {batch_id} is still {batch.status}; its results are ready when it has ended")

    async def lines() -> AsyncIterator[bytes]:
        async for line in store.result_lines(gw.sessions, batch):
            yield line.encode()

    return StreamingResponse(lines(), media_type="application/binary")
