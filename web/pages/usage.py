"""/usage: token and cost charts by day or hour, split by model or key, and the same view as CSV."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from billing.api.deps import ServiceDep, SessionDep
from kvgate.db import utcnow
from web.deps import TenantViewerDep
from web.rendering import SECURITY_HEADERS, page
from web.usage_source import FilterChoices, filter_choices, hour_rows
from web.usage_tables import CATEGORIES, LABELS, UsageTables, detail_cells, fold, to_csv
from web.usage_view import PRESETS, SPLITS, UNITS, UsageView, ViewError, parse_view

router = APIRouter()


async def _tables(
    request: Request, viewer: TenantViewerDep, service: ServiceDep, session: SessionDep
) -> tuple[UsageView, UsageTables, FilterChoices]:
    assert viewer.tenant_id is not None
    view = parse_view(request.query_params, now=utcnow())
    choices = await filter_choices(session=session, tenant_id=viewer.tenant_id)
    rows = await hour_rows(session=session, tenant_id=viewer.tenant_id, view=view, prices=service.pricebook)
    return view, fold(rows, view=view, prices=service.pricebook, key_names=choices.key_names), choices


@router.get("/usage")
async def usage(request: Request, viewer: TenantViewerDep, service: ServiceDep, session: SessionDep) -> Response:
    try:
        view, tables, choices = await _tables(request, viewer, service, session)
    except ViewError as exc:
        return page(request, "error.html", status_code=400, viewer=viewer, title="Bad request", message=str(exc))
    return page(
        request,
        "usage.html",
        viewer=viewer,
        active="usage",
        view=view,
        tables=tables,
        choices=choices,
        categories=CATEGORIES,
        labels=LABELS,
        presets=PRESETS,
        splits=SPLITS,
        units=UNITS,
        cells=detail_cells,
    )


@router.get("/usage.csv")
async def usage_csv(request: Request, viewer: TenantViewerDep, service: ServiceDep, session: SessionDep) -> Response:
    """Exactly the page's detail table (same query string), one line per row."""
    try:
        view, tables, _ = await _tables(request, viewer, service, session)
    except ViewError as exc:
        return Response(str(exc), status_code=400, media_type="text/plain")
    name = f"usage-{view.start:%Y%m%d}-{view.last_day:%Y%m%d}-by-{view.split}.csv"
    headers = {**SECURITY_HEADERS, "content-disposition": f'attachment; filename="{name}"'}
    return Response(to_csv(tables), media_type="text/csv; charset=utf-8", headers=headers)
