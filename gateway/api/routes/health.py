"""GET /healthz: the process is up and its engine serves (no auth, for probes).

503 with the reason once the engine thread has died: a load balancer stops sending
traffic, and a supervisor restarts the process.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import JSONResponse

from gateway.api.deps import GatewayDep
from gateway.generation import UNAVAILABLE_RETRY_S

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(gw: GatewayDep) -> JSONResponse:
    reason = getattr(gw.engine, "dead_reason", None)
    if reason is not None:
        body = {"status": "unavailable", "model": gw.engine.model_id, "reason": f"the engine died: {reason}"}
        return JSONResponse(body, status_code=503, headers={"retry-after": str(int(UNAVAILABLE_RETRY_S))})
    return JSONResponse({"status": "ok", "model": gw.engine.model_id})
