"""Admin: prepaid credit grants, under /admin/v1/tenants/{id}/credits."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from billing import operations
from billing.api.deps import SessionDep
from billing.money import parse_usd
from billing.schemas import CreditIn, CreditOut

router = APIRouter()


@router.post("/tenants/{tenant_id}/credits", status_code=201, response_model=CreditOut)
async def post_credit(tenant_id: str, body: CreditIn, session: SessionDep) -> Response:
    # 201 for a new grant; 200 with the first grant when its idempotency key is repeated.
    grant, created = await operations.grant_credit(
        session=session,
        tenant_id=tenant_id,
        amount_pico=parse_usd(body.amount_usd, field="amount_usd"),
        note=body.note,
        idempotency_key=body.idempotency_key,
    )
    out = CreditOut.of(grant, created=created)
    return Response(out.model_dump_json(), status_code=201 if created else 200, media_type="application/json")
