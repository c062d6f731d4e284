"""/cache: how much of the prompts the cache served, what writing it cost against what reading it saved."""

from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter, Request
from starlette.responses import Response

from billing.api.deps import ServiceDep, SessionDep
from kvgate.db import utcnow
from web.deps import TenantViewerDep
from web.rendering import page
from web.usage_source import filter_choices, hour_rows
from web.usage_tables import fold
from web.usage_view import PRESETS, ViewError, parse_view

router = APIRouter()


@router.get("/cache")
async def cache(request: Request, viewer: TenantViewerDep, service: ServiceDep, session: SessionDep) -> Response:
    assert viewer.tenant_id is not None
    try:
        view = parse_view(request.query_params, now=utcnow())
    except ViewError as exc:
        return page(request, "error.html", status_code=400, viewer=viewer, title="Bad request", message=str(exc))
    choices = await filter_choices(session=session, tenant_id=viewer.tenant_id)
    rows = await hour_rows(session=session, tenant_id=viewer.tenant_id, view=view, prices=service.pricebook)
    by_model = fold(rows, view=replace(view, split="model"), prices=service.pricebook, key_names=choices.key_names)
    by_key = fold(rows, view=replace(view, split="key"), prices=service.pricebook, key_names=choices.key_names)
    return page(
        request,
        "cache.html",
        viewer=viewer,
        active="cache",
        view=view,
        presets=PRESETS,
        tables=by_model,
        splits={"Model": by_model.by_split, "Key": by_key.by_split},
    )
