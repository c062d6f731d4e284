"""/requests: the tenant's ledger, newest first, a page at a time, with a search by request id; and below it the
latest refused requests (web/refusals.py), which never reach the ledger."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from starlette.responses import Response

from billing.api.deps import MAX_ID, SessionDep
from billing.models import LedgerEntry
from kvgate.tenancy import ApiKey
from web.deps import TenantViewerDep
from web.refusals import reason_words, recent_refusals
from web.rendering import page
from web.usage_tables import CATEGORIES, LABELS

router = APIRouter()
PAGE_SIZE = 50


@router.get("/requests")
async def requests(
    request: Request,
    viewer: TenantViewerDep,
    session: SessionDep,
    q: Annotated[str | None, Query(max_length=64)] = None,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> Response:
    """Keyset paging on the entry id (`before` is the last id of the previous page), so a page
    is one index range however deep it is."""
    query = select(LedgerEntry).where(LedgerEntry.tenant_id == viewer.tenant_id)
    search = (q or "").strip() or None
    if search is not None:
        query = query.where(LedgerEntry.request_id == search)
    if before is not None:
        query = query.where(LedgerEntry.id < before)
    entries = list((await session.scalars(query.order_by(LedgerEntry.id.desc()).limit(PAGE_SIZE + 1))).all())
    more = len(entries) > PAGE_SIZE
    entries = entries[:PAGE_SIZE]
    names = select(ApiKey.id, ApiKey.name).where(ApiKey.tenant_id == viewer.tenant_id)
    keys = dict((await session.execute(names)).all())
    refused = await recent_refusals(session, tenant_id=viewer.tenant_id or "", request_id=search)
    return page(
        request,
        "requests.html",
        viewer=viewer,
        active="requests",
        entries=entries,
        key_names=keys,
        search=search,
        older=urlencode({"before": entries[-1].id, **({"q": search} if search else {})}) if more else None,
        paged=before is not None,
        categories=CATEGORIES,
        labels=LABELS,
        refused=refused,
        reason_words=reason_words,
    )
