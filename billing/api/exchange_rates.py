"""Admin: the dated EUR exchange rates invoices state their VAT in (billing/exchange_rates.py), under
/admin/v1/exchange-rates."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from billing import exchange_rates
from billing.api.deps import SessionDep
from billing.models import ExchangeRate
from kvgate.errors import InvalidRequestError

router = APIRouter()


class ExchangeRateIn(BaseModel):
    eur_per_unit: str = Field(max_length=40, description="EUR per one unit of the currency, e.g. '0.9234'.")
    source: str = Field(max_length=200, description="Who published it, e.g. 'ECB euro reference rate'.")


class ExchangeRateOut(BaseModel):
    currency: str
    date: date
    eur_per_unit: str
    source: str

    @classmethod
    def of(cls, row: ExchangeRate) -> ExchangeRateOut:
        return cls(currency=row.currency.upper(), date=row.rate_date, eur_per_unit=row.eur_per_unit, source=row.source)


class ExchangeRateList(BaseModel):
    data: list[ExchangeRateOut]


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidRequestError("date: YYYY-MM-DD", param="date") from None


@router.put("/exchange-rates/{currency}/{on}", response_model=ExchangeRateOut)
async def put_exchange_rate(
    currency: Annotated[str, Path(max_length=8)],
    on: Annotated[str, Path(max_length=16)],
    body: ExchangeRateIn,
    session: SessionDep,
) -> ExchangeRateOut:
    row = await exchange_rates.set_rate(
        session,
        currency=exchange_rates.parse_currency(currency),
        on=_date(on),
        eur_per_unit=exchange_rates.parse_rate(body.eur_per_unit),
        source=body.source,
    )
    out = ExchangeRateOut.of(row)
    await session.commit()
    return out


@router.get("/exchange-rates", response_model=ExchangeRateList)
async def get_exchange_rates(
    session: SessionDep, currency: Annotated[str | None, Query(max_length=8)] = None
) -> ExchangeRateList:
    code = exchange_rates.parse_currency(currency) if currency is not None else None
    return ExchangeRateList(
        data=[ExchangeRateOut.of(r) for r in await exchange_rates.list_rates(session, currency=code)]
    )
