"""/: the logged-in member's Overview."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from web.deps import TenantViewerDep
from web.rendering import page

router = APIRouter()


@router.get("/")
async def overview(request: Request, viewer: TenantViewerDep) -> Response:
    return page(request, "overview.html", viewer=viewer, active="overview")
