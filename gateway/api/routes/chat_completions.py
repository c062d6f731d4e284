"""OpenAI Chat Completions: POST /v1/chat/completions."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.body import prepare_body
from gateway.api.cache_explanation import explanation_field
from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.disconnect import CLIENT_CLOSED_REQUEST, ClientGone, unless_disconnected
from gateway.api.responses import json_response
from gateway.api.schema import json_body
from gateway.generation import admit_rate, start_generation
from gateway.protocols.openai import ChatCompletion, ChatCompletionRequest
from gateway.protocols.openai_stream import chunk_events, completion_of
from gateway.services.cache_diagnostics import sealed
from gateway.services.completions import chat_job, check_retention
from gateway.sse import EventStreamResponse

router = APIRouter(prefix="/v1/chat", tags=["openai"])


@router.post("/completions", response_model=ChatCompletion, openapi_extra=json_body(ChatCompletionRequest))
async def create_chat_completion(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx)
    job = await prepare_body(gw, ctx=ctx, request=request, job=chat_job)
    prepared = job.prepared
    check_retention(gw, model=prepared.model, retention=job.retention)
    created = int(time.time())
    fingerprint = sealed(gw, tenant_id=ctx.principal.tenant_id, job=job.fingerprint)
    gen = await start_generation(
        gw, ctx=ctx, endpoint="chat.completions", prepared=prepared, rate=rate, fingerprint=fingerprint
    )
    if job.stream:
        events = chunk_events(
            gen, request_id=ctx.request_id, model=prepared.model, include_usage=job.include_usage, tools=prepared.tools
        )
        return EventStreamResponse(events, headers=gen.rate_limit_headers)
    try:
        finished, headers = await unless_disconnected(gen.complete_or_raise(), request.receive)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    completion = completion_of(
        finished, request_id=ctx.request_id, model=prepared.model, created=created, tools=prepared.tools
    )
    return json_response(completion, headers=headers, extra=explanation_field(request, finished))
