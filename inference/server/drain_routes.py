"""POST /drain and GET /drain: the engine server's drain (inference/server/drain.py), for operators."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from inference.server.auth import token_matches
from inference.server.drain import may_drain
from inference.server.errors import APIError
from inference.server.state import ServerState, server_state


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(
        None, gt=0, description="Exit this long after the drain began even if requests are still in flight."
    )


router = APIRouter()
State = Annotated[ServerState, Depends(server_state)]


def _check_caller(request: Request, state: ServerState) -> None:
    engine_token = state.engine.settings.engine_token
    if engine_token is not None and token_matches(
        request.headers.get("authorization"), engine_token.get_secret_value()
    ):
        return  # a gateway of this engine (the middleware let it in)
    token = state.engine.settings.drain_token
    allowed = may_drain(
        client_host=request.client.host if request.client else None,
        authorization=request.headers.get("authorization"),
        token=token.get_secret_value() if token else None,
    )
    if not allowed:
        why = "a valid bearer token (KVGATE_DRAIN_TOKEN)" if token else "a loopback client (or set KVGATE_DRAIN_TOKEN)"
        raise APIError(403, f"draining this engine needs {why}")


@router.post("/drain")
async def start_drain(request: Request, state: State, body: DrainRequest | None = None) -> JSONResponse:
    """Stop taking requests, finish those in flight, then exit; the answer is GET /drain's."""
    _check_caller(request, state)
    state.drain.begin(state, timeout_s=body.timeout_s if body else None)
    return JSONResponse(state.drain.status(state)._asdict(), status_code=202)


@router.get("/drain")
async def drain_status(request: Request, state: State) -> JSONResponse:
    _check_caller(request, state)
    return JSONResponse(state.drain.status(state)._asdict())
