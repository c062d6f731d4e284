"""Admin: the price catalog, under /admin/v1/prices (versions are added, never edited)."""

from __future__ import annotations

from fastapi import APIRouter

from billing import catalog, operations
from billing.api.deps import ModelFilter, ServiceDep, SessionDep
from billing.schemas import PriceIn, PriceList, PriceOut

router = APIRouter()


@router.get("/prices", response_model=PriceList)
async def get_prices(session: SessionDep, model: ModelFilter = None) -> PriceList:
    return PriceList(data=[PriceOut.of(v) for v in await catalog.list_versions(session=session, model=model)])


@router.post("/prices", status_code=201, response_model=PriceOut)
async def add_price(body: PriceIn, session: SessionDep, service: ServiceDep) -> PriceOut:
    version = await operations.add_price(session=session, spec=body.spec(), source="admin api")
    await service.refresh_prices()  # this process prices with it at once; others at their next refresh
    return PriceOut.of(version)
