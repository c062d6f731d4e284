"""OpenAI Chat Completions: POST /v1/chat/completions."""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.responses import Response

from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.responses import json_response
from gateway.generation import start_generation
from gateway.protocols.openai import ChatCompletion, ChatCompletionRequest
from gateway.protocols.openai_stream import chunk_events, completion_of
from gateway.services.completions import prepare_chat_completion
from gateway.sse import EventStreamResponse

router = APIRouter(prefix="/v1/chat", tags=["openai"])


@router.post("/completions", response_model=ChatCompletion)
async def create_chat_completion(body: ChatCompletionRequest, gw: GatewayDep, ctx: ContextDep) -> Response:
    prepared = prepare_chat_completion(gw, request=body)
    created = int(time.time())
    gen = await start_generation(gw, ctx=ctx, endpoint="chat.completions", prepared=prepared)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = chunk_events(gen, request_id=ctx.request_id, model=prepared.model, include_usage=include_usage)
        return EventStreamResponse(events, headers=gen.rate_limit_headers)
    finished, headers = await gen.complete_or_raise()
    completion = completion_of(finished, request_id=ctx.request_id, model=prepared.model, created=created)
    return json_response(completion, headers=headers)
