"""GET /healthz: the process is up and the engine is loaded (no auth, for probes)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.deps import GatewayDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(gw: GatewayDep) -> dict[str, str]:
    return {"status": "ok", "model": gw.engine.model_id}
