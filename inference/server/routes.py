"""The endpoints: thin handlers over inputs (body -> engine inputs), the engine, and outputs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from inference.server.drain import DRAINING
from inference.server.errors import error_response
from inference.server.inputs import EngineInputs, chat_inputs, completion_inputs
from inference.server.outputs import CHAT, COMPLETION, OutputFormat, ResponseContext, new_id
from inference.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from inference.server.state import ServerState, server_state
from inference.server.streaming import EventStreamResponse, events, failure, result_unless_disconnected

router = APIRouter()
State = Annotated[ServerState, Depends(server_state)]


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: State) -> Response:
    return await _generate(request, state, completion_inputs(body, state.engine), COMPLETION)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State) -> Response:
    return await _generate(request, state, chat_inputs(body, state.engine), CHAT)


async def _generate(request: Request, state: ServerState, inputs: EngineInputs, fmt: OutputFormat) -> Response:
    if state.drain.draining:  # checked and submitted in one turn of the loop: none slips past a drain
        return error_response(503, "draining: this engine takes no new requests")
    ctx = ResponseContext(id=new_id(fmt.id_prefix), model=state.engine.model_id, params=inputs.params)
    # Raises InvalidRequestError (400), EngineOverloadedError or EngineUnavailableError (503) before anything is
    # queued.
    # The grammar, if any, compiles on a thread (a 400 if it is over its limits), not on this loop.
    await state.engine.prepare(inputs.params, share=inputs.share)
    if state.drain.draining:
        return error_response(503, "draining: this engine takes no new requests")
    handle = state.engine.submit(
        inputs.prompt_token_ids, inputs.params, inputs.cache, request_id=ctx.id, share=inputs.share
    )
    state.watch(handle)
    if inputs.stream:
        return EventStreamResponse(events(handle, fmt, ctx, inputs.include_usage, inputs.continuous_usage))
    output = await result_unless_disconnected(handle, request)
    if output is None:
        return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
    if output.finish_reason not in ("stop", "length"):
        return error_response(*failure(output))
    return JSONResponse(fmt.whole(ctx, output).model_dump())


@router.get("/v1/models")
async def models(state: State) -> ModelList:
    engine = state.engine
    card = ModelCard(id=engine.model_id, root=engine.settings.model, max_model_len=engine.max_model_len)
    return ModelList(data=[card])


@router.get("/health")
async def health(state: State, detail: bool = False) -> Response:
    """200 while the engine serves; 503 with the reason once its thread has died (as vLLM's /health), or with
    "draining" once a drain began (inference/server/drain.py). ?detail=true: a JSON body with the kernel plan."""
    if state.drain.draining:
        return error_response(503, DRAINING)
    reason = state.engine.dead_reason
    if reason is not None:
        return error_response(503, f"the engine died: {reason}")
    core = state.engine.core
    if detail and core is not None:
        return JSONResponse({"status": "ok", "kernel_plan": {**core.plan.describe(), "digest": core.plan.digest()}})
    return Response(status_code=200)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)
