"""Anthropic Messages: POST /v1/messages and POST /v1/messages/count_tokens."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from gateway.api.body import prepare_body
from gateway.api.cache_explanation import explanation_field
from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.disconnect import CLIENT_CLOSED_REQUEST, ClientGone, unless_disconnected
from gateway.api.responses import json_response
from gateway.api.schema import json_body
from gateway.generation import admit_rate, start_generation
from gateway.protocols.anthropic import (
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
    message_id,
)
from gateway.protocols.anthropic_betas import HEADER, check_betas
from gateway.protocols.anthropic_stream import message_events, message_of
from gateway.protocols.cache_diagnostics import anthropic_diagnostics
from gateway.services.cache_diagnostics import diagnose
from gateway.services.completions import count_tokens_job, message_job
from gateway.sse import EventStreamResponse


async def known_betas(request: Request, ctx: ContextDep) -> None:
    """Unknown `anthropic-beta` values are a 400 (after authentication, as at Anthropic)."""
    check_betas(request.headers.getlist(HEADER))


router = APIRouter(prefix="/v1/messages", tags=["anthropic"], dependencies=[Depends(known_betas)])


@router.post("", response_model=MessageResponse, openapi_extra=json_body(MessagesRequest))
async def create_message(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx)
    job = await prepare_body(gw, ctx=ctx, request=request, job=message_job)
    prepared = job.prepared
    diagnosis = await diagnose(
        gw, tenant_id=ctx.principal.tenant_id, response_id=message_id(ctx.request_id), job=job.fingerprint
    )
    diagnostics = anthropic_diagnostics(diagnosis.comparison)
    gen = await start_generation(
        gw, ctx=ctx, endpoint="messages", prepared=prepared, rate=rate, fingerprint=diagnosis.fingerprint
    )
    if job.stream:
        events = message_events(
            gen, request_id=ctx.request_id, model=prepared.model, tools=prepared.tools, diagnostics=diagnostics
        )
        return EventStreamResponse(events, headers=gen.rate_limit_headers)
    try:
        finished, headers = await unless_disconnected(gen.complete_or_raise(), request.receive)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    message = message_of(finished, request_id=ctx.request_id, model=prepared.model, tools=prepared.tools)
    message.diagnostics = diagnostics
    return json_response(message, headers=headers, extra=explanation_field(request, finished))


@router.post("/count_tokens", response_model=CountTokensResponse, openapi_extra=json_body(CountTokensRequest))
async def count_tokens(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx, counts_input_tokens=False)
    tokens = await prepare_body(gw, ctx=ctx, request=request, job=count_tokens_job)
    return json_response(CountTokensResponse(input_tokens=tokens), headers=rate.headers)
