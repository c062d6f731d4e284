"""Admin: the usage ledger, under /admin/v1/usage: lists, CSV export, summaries, reversals."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from starlette.responses import StreamingResponse

from billing import operations
from billing.api.deps import MAX_ID, ServiceDep, SessionDep, UsageFilters
from billing.csv_export import iter_csv
from billing.schemas import ReverseIn, ReverseOut, SummaryList, SummaryOut, UsageList, UsageOut
from billing.usage_queries import check_group_by, iter_usage, list_usage, summarize

router = APIRouter()


@router.get("/usage", response_model=UsageList)
async def get_usage(
    session: SessionDep,
    where: UsageFilters,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after_id: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
) -> UsageList:
    rows = await list_usage(session=session, where=where, limit=limit, after_id=after_id)
    return UsageList(data=[UsageOut.of(r) for r in rows], next_after_id=rows[-1].id if len(rows) == limit else None)


@router.get("/usage/export.csv", response_class=StreamingResponse)
async def export_usage(service: ServiceDep, where: UsageFilters) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        # Its own session: the request's closes before the response streams.
        async with service.sessions() as session:
            rows = [row async for row in iter_usage(session=session, where=where)]
        for chunk in iter_csv(rows):
            yield chunk

    headers = {"content-disposition": 'attachment; filename="usage.csv"'}
    return StreamingResponse(body(), media_type="text/csv", headers=headers)


@router.get("/usage/summary", response_model=SummaryList)
async def usage_summary(
    session: SessionDep,
    where: UsageFilters,
    group_by: Annotated[
        list[Literal["day", "model", "key"]] | None,
        Query(
            description="day (the default), model or key; repeat to group by several, e.g. group_by=model&group_by=key"
        ),
    ] = None,
) -> SummaryList:
    groups = check_group_by(group_by or ["day"])
    rows = await summarize(session=session, where=where, group_by=groups)
    return SummaryList(group_by=list(groups), data=[SummaryOut.of(r) for r in rows])


@router.post("/usage/{request_id}/reverse", response_model=ReverseOut)
async def reverse_usage(request_id: str, body: ReverseIn, session: SessionDep) -> ReverseOut:
    settlement = await operations.reverse_usage(session=session, request_id=request_id, reason=body.reason)
    return ReverseOut.of(request_id, settlement)
