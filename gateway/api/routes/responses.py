"""OpenAI Responses: POST /v1/responses, GET and DELETE /v1/responses/{id}, POST /v1/responses/input_tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Literal

import structlog
from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from gateway.api.body import read_body, run_job
from gateway.api.cache_explanation import explanation_field
from gateway.api.deps import ContextDep, GatewayDep, SessionDep
from gateway.api.disconnect import CLIENT_CLOSED_REQUEST, ClientGone, unless_disconnected
from gateway.api.responses import json_response
from gateway.api.schema import json_body
from gateway.generation import RequestContext, admit_rate, start_generation
from gateway.logs import log_failure
from gateway.protocols.cache_diagnostics import openai_diagnostics
from gateway.protocols.responses import InputTokensRequest, ResponsesRequest, listed_items
from gateway.protocols.responses_stream import (
    DeletedResponse,
    InputTokenCount,
    ResponseObject,
    response_events,
    response_id,
    response_of,
)
from gateway.responses_store import NewResponse, conversation_after, input_items, remove, response_json, save
from gateway.services.cache_diagnostics import diagnose
from gateway.services.completions import check_retention
from gateway.services.responses import PreparedResponse, input_tokens_job, responses_job
from gateway.sse import EventStreamResponse
from gateway.state import Gateway
from kvgate.errors import InvalidRequestError

router = APIRouter(prefix="/v1/responses", tags=["openai"])
log = structlog.get_logger("kvgate.gateway")


async def _prepare(
    gw: Gateway, *, ctx: RequestContext, request: Request, job: Callable[..., PreparedResponse] = responses_job
) -> PreparedResponse:
    """The body prepared; with previous_response_id, again with the stored conversation before it."""
    raw = await read_body(request, limit=gw.prep.renderer.bounds.max_body_bytes)
    content_type = request.headers.get("content-type")
    first = await run_job(gw, ctx=ctx, job=job, raw=raw, content_type=content_type)
    previous = first.settings.previous_response_id
    if first.prepared is not None or previous is None:
        return first
    history = await conversation_after(gw.sessions, tenant_id=ctx.principal.tenant_id, response_id=previous)
    size = len(raw) + len(json.dumps(history))
    with_history = partial(job, history=history)
    return await run_job(gw, ctx=ctx, job=with_history, raw=raw, content_type=content_type, size=size)


async def _persist(gw: Gateway, ctx: RequestContext, job: PreparedResponse, response: ResponseObject) -> None:
    """Store the response for GET and previous_response_id (unless store is false).

    A failed write is logged and the response still goes out: the tokens are spent and billed,
    and only a later GET or continuation of this id will miss it.
    """
    if not job.settings.store:
        return
    new = NewResponse(
        id=response.id,
        tenant_id=ctx.principal.tenant_id,
        api_key_id=ctx.principal.api_key_id,
        model=response.model,
        status=response.status,
        previous_response_id=job.settings.previous_response_id,
        instructions=job.settings.instructions,
        input_items=list(job.input_items),
        context=list(job.context),
        response=response.model_dump(mode="json"),
    )
    try:
        await save(gw.sessions, new)
    except Exception as error:
        if gw.db_health.observe(error):
            log.debug("response_store_failed", request_id=ctx.request_id, error=str(error))
        else:
            log_failure(log, "response_store_failed", request_id=ctx.request_id)


@router.post("", response_model=ResponseObject, openapi_extra=json_body(ResponsesRequest))
async def create_response(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx)
    job = await _prepare(gw, ctx=ctx, request=request)
    prepared = job.prepared
    assert prepared is not None  # _prepare renders once the history is in
    check_retention(gw, model=prepared.model, retention=job.settings.prompt_cache_retention)
    assert job.fingerprint is not None  # made with prepared
    diagnosis = await diagnose(
        gw, tenant_id=ctx.principal.tenant_id, response_id=response_id(ctx.request_id), job=job.fingerprint
    )
    if diagnosis.comparison is not None:
        diagnostics = openai_diagnostics(diagnosis.comparison)
        job = replace(job, settings=replace(job.settings, prompt_cache_diagnostics=diagnostics))
    created_at = int(time.time())
    gen = await start_generation(
        gw, ctx=ctx, endpoint="responses", prepared=prepared, rate=rate, fingerprint=diagnosis.fingerprint
    )
    persist = partial(_persist, gw, ctx, job)
    if job.stream:
        events = response_events(
            gen,
            settings=job.settings,
            request_id=ctx.request_id,
            created_at=created_at,
            persist=persist,
            tools=prepared.tools,
        )
        return EventStreamResponse(events, headers=gen.rate_limit_headers)
    try:
        finished, headers = await unless_disconnected(gen.complete_or_raise(), request.receive)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    response = response_of(
        finished, settings=job.settings, request_id=ctx.request_id, created_at=created_at, tools=prepared.tools
    )
    await persist(response)
    return json_response(response, headers=headers, extra=explanation_field(request, finished))


@router.post("/input_tokens", response_model=InputTokenCount, openapi_extra=json_body(InputTokensRequest))
async def count_input_tokens(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    """The prompt a /v1/responses request with this body would render, in tokens (as count_tokens does)."""
    rate = await admit_rate(gw, ctx=ctx, counts_input_tokens=False)
    job = await _prepare(gw, ctx=ctx, request=request, job=input_tokens_job)
    assert job.prepared is not None
    return json_response(InputTokenCount(input_tokens=len(job.prepared.prompt.token_ids)), headers=rate.headers)


@router.get("/{response_id}", response_model=ResponseObject)
async def get_response(response_id: str, request: Request, ctx: ContextDep, session: SessionDep) -> Response:
    if request.query_params.get("stream", "false").lower() == "true":
        raise InvalidRequestError("stream: streaming a stored response is not supported", param="stream")
    body = await response_json(session, tenant_id=ctx.principal.tenant_id, response_id=response_id)
    return Response(content=body, media_type="application/json")


@router.delete("/{response_id}", response_model=DeletedResponse)
async def delete_response(response_id: str, ctx: ContextDep, session: SessionDep) -> Response:
    await remove(session, tenant_id=ctx.principal.tenant_id, response_id=response_id)
    return json_response(DeletedResponse(id=response_id))


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    ctx: ContextDep,
    session: SessionDep,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    """The request's own input items (not the earlier turns'), newest first by default, as OpenAI pages them."""
    items = listed_items(
        await input_items(session, tenant_id=ctx.principal.tenant_id, response_id=response_id), response_id
    )
    if order == "desc":
        items.reverse()
    ids = [item["id"] for item in items]
    if after is not None and after not in ids:
        raise InvalidRequestError(f"after: response {response_id} has no input item {after!r}", param="after")
    start = ids.index(after) + 1 if after is not None else 0
    page = items[start : start + limit]
    body = {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(items),
    }
    return Response(content=json.dumps(body), media_type="application/json")
