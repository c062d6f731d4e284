"""GET /healthz: the process is up and its engine serves (no auth, for probes).

503 with the reason once the engine thread has died: a load balancer stops sending
traffic, and a supervisor restarts the process.
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.deps import GatewayDep
from gateway.generation import UNAVAILABLE_RETRY_S
from inference.types import EngineError
from kvgate.errors import UnavailableError

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(gw: GatewayDep) -> dict[str, str]:
    try:
        await gw.engine.check_health()
    except EngineError as exc:
        # A dead engine does not come back by itself: the body names why, retry-after says when to look again.
        raise UnavailableError(str(exc), headers={"retry-after": str(int(UNAVAILABLE_RETRY_S))}) from exc
    return {"status": "ok", "model": gw.engine.model_id}
