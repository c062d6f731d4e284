"""The usage API in OpenAI's shape: GET /v1/organization/usage/completions and GET /v1/organization/costs.

Both read billing.usage_buckets (the hourly rollups, or the ledger for minutes) for the calling key's
tenant only; a key or model filter naming another tenant's finds nothing.
"""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy.ext.asyncio import AsyncSession

from billing.api.deps import SessionDep
from billing.api.tenant.deps import CallerDep, CompletionsPage, CostsPage, UsagePage
from billing.api.tenant.schemas import CompletionsPageOut, CostsPageOut, completions_bucket, costs_bucket
from billing.usage_buckets import Bucket, usage_buckets

router = APIRouter(prefix="/v1/organization", tags=["usage"])


async def _buckets(session: AsyncSession, tenant_id: str, page: UsagePage) -> list[Bucket]:
    return await usage_buckets(
        session=session,
        tenant_id=tenant_id,
        start=page.start,
        end=page.end,
        width=page.width,
        group_by=page.group_by,
        models=page.models,
        api_key_ids=page.api_key_ids,
    )


@router.get("/usage/completions", response_model=CompletionsPageOut)
async def usage_completions(caller: CallerDep, page: CompletionsPage, session: SessionDep) -> CompletionsPageOut:
    buckets = await _buckets(session, caller.tenant_id, page)
    return CompletionsPageOut(
        data=[completions_bucket(b) for b in buckets], has_more=page.has_more, next_page=page.next_page
    )


@router.get("/costs", response_model=CostsPageOut)
async def costs(caller: CallerDep, page: CostsPage, session: SessionDep) -> CostsPageOut:
    buckets = await _buckets(session, caller.tenant_id, page)
    return CostsPageOut(data=[costs_bucket(b) for b in buckets], has_more=page.has_more, next_page=page.next_page)
