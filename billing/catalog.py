"""The price catalog in the database: seeding from TOML, adding versions, loading a PriceBook."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.models import PriceVersionRow
from billing.pricebook import PriceBook
from billing.prices import PriceError, PriceSpec, PriceVersion
from kvgate.errors import ConflictError


class PriceConflictError(ConflictError, PriceError):
    """A version for this model and effective_from already exists with other prices."""


@dataclass(frozen=True)
class SeedResult:
    created: tuple[PriceVersion, ...]
    unchanged: int


def to_version(row: PriceVersionRow) -> PriceVersion:
    return PriceVersion(
        id=row.id,
        model=row.model,
        effective_from=row.effective_from,
        input_usd_per_mtok=row.input_usd_per_mtok,
        output_usd_per_mtok=row.output_usd_per_mtok,
        cache_write_5m_multiplier=row.cache_write_5m_multiplier,
        cache_write_1h_multiplier=row.cache_write_1h_multiplier,
        cache_read_multiplier=row.cache_read_multiplier,
        cache_write_24h_multiplier=row.cache_write_24h_multiplier,
        cache_write_30m_multiplier=row.cache_write_30m_multiplier,
        cache_write_12h_multiplier=row.cache_write_12h_multiplier,
        batch_multiplier=row.batch_multiplier,
    )


async def list_versions(*, session: AsyncSession, model: str | None = None) -> list[PriceVersion]:
    query = select(PriceVersionRow).order_by(PriceVersionRow.model, PriceVersionRow.effective_from)
    if model is not None:
        query = query.where(PriceVersionRow.model == model)
    return [to_version(row) for row in (await session.scalars(query)).all()]


async def load_pricebook(*, session: AsyncSession) -> PriceBook:
    return PriceBook(await list_versions(session=session))


async def version_before(*, session: AsyncSession, model: str, at: datetime) -> PriceVersion | None:
    """The model's own version in force just before `at` (the '*' fallback is not the model's)."""
    row = await session.scalar(
        select(PriceVersionRow)
        .where(PriceVersionRow.model == model, PriceVersionRow.effective_from < at)
        .order_by(PriceVersionRow.effective_from.desc())
        .limit(1)
    )
    return None if row is None else to_version(row)


async def add_version(*, session: AsyncSession, spec: PriceSpec, source: str) -> PriceVersion:
    """Insert a new version; a second one for the same model and instant is a conflict, never an edit."""
    existing = await session.scalar(
        select(PriceVersionRow).where(
            PriceVersionRow.model == spec.model, PriceVersionRow.effective_from == spec.effective_from
        )
    )
    if existing is not None:
        raise PriceConflictError(
            f"{spec.model} already has a version effective from {spec.effective_from.isoformat()} "
            f"(id {existing.id}); add a version with a later effective_from instead of editing it"
        )
    row = PriceVersionRow(
        model=spec.model,
        effective_from=spec.effective_from,
        input_usd_per_mtok=spec.input_usd_per_mtok,
        output_usd_per_mtok=spec.output_usd_per_mtok,
        cache_write_5m_multiplier=spec.cache_write_5m_multiplier,
        cache_write_1h_multiplier=spec.cache_write_1h_multiplier,
        cache_read_multiplier=spec.cache_read_multiplier,
        cache_write_24h_multiplier=spec.cache_write_24h_multiplier,
        cache_write_30m_multiplier=spec.cache_write_30m_multiplier,
        cache_write_12h_multiplier=spec.cache_write_12h_multiplier,
        batch_multiplier=spec.batch_multiplier,
        source=source[:200],
    )
    session.add(row)
    await session.flush()
    return to_version(row)


async def seed_prices(*, session: AsyncSession, specs: Iterable[PriceSpec], source: str) -> SeedResult:
    """Bring the catalog up to the seed file; idempotent, so it runs at every start.

    An entry whose prices equal the version in force at its effective_from adds
    nothing; an entry with new prices becomes a new version. Changing an entry that
    already exists (same model and effective_from) is refused: history is not edited.
    """
    book = await load_pricebook(session=session)
    created: list[PriceVersion] = []
    unchanged = 0
    for spec in sorted(specs, key=lambda s: (s.model, s.effective_from)):
        current = _in_force_for_exact_model(book, spec)
        if current is not None and current.effective_from == spec.effective_from:
            if not current.same_prices(spec):
                raise PriceConflictError(
                    f"{source}: {spec.model} at {spec.effective_from.isoformat()} differs from the stored "
                    f"version {current.id}; give the new prices a later effective_from"
                )
            unchanged += 1
        elif current is not None and current.same_prices(spec):
            unchanged += 1
        else:
            created.append(await add_version(session=session, spec=spec, source=source))
            book = PriceBook([*book.versions(), created[-1]])
    return SeedResult(created=tuple(created), unchanged=unchanged)


def _in_force_for_exact_model(book: PriceBook, spec: PriceSpec) -> PriceVersion | None:
    candidates = [v for v in book.versions() if v.model == spec.model and v.effective_from <= spec.effective_from]
    return candidates[-1] if candidates else None
