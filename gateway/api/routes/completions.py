"""OpenAI legacy Completions: POST /v1/completions."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.body import prepare_body
from gateway.api.deps import ContextDep, GatewayDep
from gateway.api.disconnect import CLIENT_CLOSED_REQUEST, ClientGone, unless_disconnected
from gateway.api.responses import json_response
from gateway.api.schema import json_body
from gateway.generation import admit_rate, start_generation
from gateway.protocols.completions import CompletionRequest, TextCompletion, completion_chunks, text_completion_of
from gateway.services.legacy_completions import completion_job
from gateway.sse import EventStreamResponse

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/completions", response_model=TextCompletion, openapi_extra=json_body(CompletionRequest))
async def create_completion(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx)
    job = await prepare_body(gw, ctx=ctx, request=request, job=completion_job)
    prepared = job.prepared
    created = int(time.time())
    gen = await start_generation(gw, ctx=ctx, endpoint="completions", prepared=prepared, rate=rate)
    if job.stream:
        events = completion_chunks(
            gen, request_id=ctx.request_id, model=prepared.model, include_usage=job.include_usage
        )
        return EventStreamResponse(events, headers=gen.rate_limit_headers)
    try:
        finished, headers = await unless_disconnected(gen.complete_or_raise(), request.receive)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    completion = text_completion_of(finished, request_id=ctx.request_id, model=prepared.model, created=created)
    return json_response(completion, headers=headers)
