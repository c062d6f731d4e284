"""GET /healthz: the process is up and the engine is running (no auth, for probes); 503 when it is not."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.deps import GatewayDep
from inference.types import EngineError
from kvgate.errors import UnavailableError

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(gw: GatewayDep) -> dict[str, str]:
    try:
        await gw.engine.check_health()
    except EngineError as exc:
        raise UnavailableError(str(exc)) from exc
    return {"status": "ok", "model": gw.engine.model_id}
