"""Anthropic Messages: POST /v1/messages and POST /v1/messages/count_tokens."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.responses import json_response
from gateway.errors import ApiError
from gateway.generation import start_generation
from gateway.protocols.anthropic import CountTokensRequest, CountTokensResponse, MessageResponse, MessagesRequest
from gateway.protocols.anthropic_stream import message_events, message_of
from gateway.services.completions import count_message_tokens, prepare_message
from gateway.sse import EventStreamResponse

router = APIRouter(prefix="/v1/messages", tags=["anthropic"])


@router.post("", response_model=MessageResponse)
async def create_message(body: MessagesRequest, gw: GatewayDep, ctx: ContextDep) -> Response:
    prepared = prepare_message(gw, request=body)
    gen = await start_generation(
        gw,
        ctx=ctx,
        model=prepared.model,
        endpoint="messages",
        prompt=prepared.prompt,
        regions=prepared.regions,
        sampling=prepared.sampling,
        client_salt=prepared.client_salt,
    )
    headers = gen.rate_limit_headers
    if body.stream:
        return EventStreamResponse(
            message_events(gen, request_id=ctx.request_id, model=prepared.model), headers=headers
        )
    finished = await gen.complete()
    if finished.status == "error":
        raise ApiError(finished.output.error or "the engine failed while generating")
    if finished.cost_usd is not None:
        headers["kvgate-cost-usd"] = str(finished.cost_usd)
    return json_response(message_of(finished, request_id=ctx.request_id, model=prepared.model), headers=headers)


@router.post("/count_tokens", response_model=CountTokensResponse)
async def count_tokens(body: CountTokensRequest, gw: GatewayDep, ctx: ContextDep) -> Response:
    return json_response(CountTokensResponse(input_tokens=count_message_tokens(gw, request=body)))
