"""Admin: the price catalog, under /admin/v1/prices (versions are added, never edited)."""

from __future__ import annotations

from fastapi import APIRouter

from billing import catalog, operations
from billing.api.deps import ModelFilter, ServiceDep, SessionDep
from billing.schemas import PriceAddedOut, PriceIn, PriceList, PriceOut

router = APIRouter()


@router.get("/prices", response_model=PriceList)
async def get_prices(session: SessionDep, model: ModelFilter = None) -> PriceList:
    return PriceList(data=[PriceOut.of(v) for v in await catalog.list_versions(session=session, model=model)])


@router.post("/prices", status_code=201, response_model=PriceAddedOut)
async def add_price(body: PriceIn, session: SessionDep, service: ServiceDep) -> PriceAddedOut:
    """Fields the body leaves out are carried over from the model's previous version (named in carried_over)."""
    added = await operations.add_price(session=session, change=body.change(), source="admin api")
    await service.refresh_prices()  # this process prices with it at once; others at their next refresh
    return PriceAddedOut.added(added)
