"""OpenAI Chat Completions: POST /v1/chat/completions."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.body import parse_and_prepare
from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.disconnect import CLIENT_CLOSED_REQUEST, ClientGone, unless_disconnected
from gateway.api.responses import json_response
from gateway.api.schema import json_body
from gateway.generation import admit_rate, start_generation
from gateway.protocols.openai import ChatCompletion, ChatCompletionRequest
from gateway.protocols.openai_stream import chunk_events, completion_of
from gateway.services.completions import prepare_chat_completion
from gateway.sse import EventStreamResponse

router = APIRouter(prefix="/v1/chat", tags=["openai"])


@router.post("/completions", response_model=ChatCompletion, openapi_extra=json_body(ChatCompletionRequest))
async def create_chat_completion(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx)
    body, prepared = await parse_and_prepare(
        gw,
        ctx=ctx,
        request=request,
        model=ChatCompletionRequest,
        prepare=lambda b: prepare_chat_completion(gw, request=b),
    )
    created = int(time.time())
    gen = await start_generation(gw, ctx=ctx, endpoint="chat.completions", prepared=prepared, rate=rate)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = chunk_events(gen, request_id=ctx.request_id, model=prepared.model, include_usage=include_usage)
        return EventStreamResponse(events, headers=gen.rate_limit_headers)
    try:
        finished, headers = await unless_disconnected(gen.complete_or_raise(), request.receive)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    completion = completion_of(finished, request_id=ctx.request_id, model=prepared.model, created=created)
    return json_response(completion, headers=headers)
