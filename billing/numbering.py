"""Gapless document numbers (invoices, credit notes).

The sequence row is bumped with UPDATE ... RETURNING inside the transaction that
issues the document, so the row lock orders concurrent issuers and a rolled-back
transaction gives its number back: no gaps, no repeats.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from billing.models import BillingSequence
from kvgate.db import insert_ignore


async def next_number(*, session: AsyncSession, name: str) -> int:
    await insert_ignore(session, BillingSequence, {"name": name, "last_value": 0}, ["name"])
    result = await session.execute(
        update(BillingSequence)
        .where(BillingSequence.name == name)
        .values(last_value=BillingSequence.last_value + 1)
        .returning(BillingSequence.last_value)
    )
    return int(result.scalar_one())
