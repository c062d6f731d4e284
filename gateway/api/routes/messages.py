"""Anthropic Messages: POST /v1/messages and POST /v1/messages/count_tokens."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.responses import json_response
from gateway.generation import start_generation
from gateway.protocols.anthropic import CountTokensRequest, CountTokensResponse, MessageResponse, MessagesRequest
from gateway.protocols.anthropic_stream import message_events, message_of
from gateway.services.completions import count_message_tokens, prepare_message
from gateway.sse import EventStreamResponse

router = APIRouter(prefix="/v1/messages", tags=["anthropic"])


@router.post("", response_model=MessageResponse)
async def create_message(body: MessagesRequest, gw: GatewayDep, ctx: ContextDep) -> Response:
    prepared = prepare_message(gw, request=body)
    gen = await start_generation(gw, ctx=ctx, endpoint="messages", prepared=prepared)
    if body.stream:
        events = message_events(gen, request_id=ctx.request_id, model=prepared.model)
        return EventStreamResponse(events, headers=gen.rate_limit_headers)
    finished, headers = await gen.complete_or_raise()
    return json_response(message_of(finished, request_id=ctx.request_id, model=prepared.model), headers=headers)


@router.post("/count_tokens", response_model=CountTokensResponse)
async def count_tokens(body: CountTokensRequest, gw: GatewayDep, ctx: ContextDep) -> Response:
    return json_response(CountTokensResponse(input_tokens=count_message_tokens(gw, request=body)))
