"""GET /metrics: the gateway's and the embedded engine's Prometheus metrics, behind the admin token.

Behind the token because the counters describe the whole deployment's traffic; a
Prometheus scrape config sends it with `authorization: {credentials: <token>}`.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.api.deps import AdminDep, GatewayDep

router = APIRouter(tags=["metrics"], dependencies=[AdminDep])


@router.get("/metrics")
async def metrics(gw: GatewayDep) -> Response:
    body, content_type = gw.metrics.render()
    return Response(body, media_type=content_type)
