"""Admin: usage spooled to disk while the database was away, under /admin/v1/billing/spool."""

from __future__ import annotations

from fastapi import APIRouter

from billing.api.deps import ServiceDep
from billing.errors import UnavailableError
from billing.schemas import SpoolOut

router = APIRouter()


@router.get("/billing/spool", response_model=SpoolOut)
async def spool_status(service: ServiceDep) -> SpoolOut:
    return SpoolOut(pending=service.spool.pending())


@router.post("/billing/spool/replay", response_model=SpoolOut)
async def spool_replay(service: ServiceDep) -> SpoolOut:
    try:
        result = await service.replay_spool()
    except Exception as exc:
        if not service.health.observe(exc):
            raise
        raise UnavailableError(f"the database is still unavailable: {exc}") from exc
    return SpoolOut(
        pending=service.spool.pending(), replayed=result.records, applied=result.applied, corrupt=result.corrupt
    )
