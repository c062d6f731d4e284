"""Spend limits: per-tenant monthly limits, prepaid credit, per-key monthly limits.

Admission reserves the request's worst-case cost against every counter that has
a limit, with one conditional UPDATE per counter:

    UPDATE budget_counters SET reserved = reserved + r
    WHERE <counter> AND spent + reserved + r <= limit

The row lock that UPDATE takes serializes concurrent admissions on a counter, so
spent + reserved never passes the limit; since a reservation bounds its request's
cost, settled spend never passes it either. Settlement releases the reservation
and adds the real cost in the same transaction that writes the ledger entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from billing.errors import BillingDomainError
from billing.models import BudgetCounter, BudgetReservation, KeyBudget, TenantBudget
from billing.periods import month_start, period_key
from kvgate.db import insert_ignore, utcnow
from kvgate.errors import BillingError, NotFoundError
from kvgate.tenancy import ApiKey

TENANT_MONTH = "tenant_month"
KEY_MONTH = "key_month"
TENANT_CREDIT = "tenant_credit"
ALL_TIME = "all"


class BudgetError(BillingDomainError, ValueError):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message, field=field)


class UnknownOwnerError(NotFoundError, BudgetError):
    pass


class BudgetExceededError(BillingError):
    """Admitting the request could overrun a limit; nothing was reserved.

    402 billing_error on the Anthropic API; OpenAI spells an exhausted quota 429 insufficient_quota.
    """

    openai_status = 429

    def __init__(self, *, scope: str, limit_pico: int, spent_pico: int, reserved_pico: int, needed_pico: int):
        self.scope = scope
        self.limit_pico = limit_pico
        self.spent_pico = spent_pico
        self.reserved_pico = reserved_pico
        self.needed_pico = needed_pico
        self.refusal, self.refusal_reserve_pico = scope, needed_pico  # kvgate.errors.KvgateError.refusal
        what = {
            TENANT_MONTH: "the monthly spend limit",
            KEY_MONTH: "this API key's monthly spend limit",
            TENANT_CREDIT: "the prepaid credit balance",
        }[scope]
        super().__init__(f"This request could exceed {what}; raise the limit or add credit to continue.")


@dataclass(frozen=True)
class CounterKey:
    scope: str
    owner_id: str
    period: str


@dataclass(frozen=True)
class Reservation:
    request_id: str
    amount_pico: int
    counters: tuple[CounterKey, ...]
    # Per counter, spent + reserved right after this hold (what admission remembers for outages).
    balances: tuple[int, ...] = ()


@dataclass(frozen=True)
class Limits:
    """The limits that apply to one request: (counter, limit in pico) pairs."""

    checks: tuple[tuple[CounterKey, int], ...]


@dataclass(frozen=True)
class CounterState:
    scope: str
    period: str
    limit_pico: int | None
    spent_pico: int
    reserved_pico: int

    @property
    def remaining_pico(self) -> int | None:
        return None if self.limit_pico is None else self.limit_pico - self.spent_pico - self.reserved_pico


@dataclass(frozen=True)
class KeyLimitState:
    """One API key's own monthly limit (None: none) and its spend this month."""

    api_key_id: str
    name: str
    revoked: bool
    month: CounterState


@dataclass(frozen=True)
class BudgetStatus:
    tenant_id: str
    monthly_limit_pico: int | None
    prepaid: bool
    credit_granted_pico: int
    month: CounterState
    credit: CounterState
    keys: tuple[KeyLimitState, ...] = ()
    """The tenant's keys: every unrevoked one, and revoked ones with spend this month."""


async def limits_for(*, session: AsyncSession, tenant_id: str, api_key_id: str | None, month: date) -> Limits:
    checks: list[tuple[CounterKey, int]] = []
    budget = await session.get(TenantBudget, tenant_id)
    if budget is not None:
        if budget.monthly_limit_pico is not None:
            checks.append((CounterKey(TENANT_MONTH, tenant_id, period_key(month)), budget.monthly_limit_pico))
        if budget.prepaid:
            checks.append((CounterKey(TENANT_CREDIT, tenant_id, ALL_TIME), budget.credit_granted_pico))
    if api_key_id is not None:
        key_budget = await session.get(KeyBudget, api_key_id)
        if key_budget is not None and key_budget.monthly_limit_pico is not None:
            checks.append((CounterKey(KEY_MONTH, api_key_id, period_key(month)), key_budget.monthly_limit_pico))
    # One lock order for every transaction, so concurrent admissions cannot deadlock.
    return Limits(checks=tuple(sorted(checks, key=lambda c: counter_order(c[0]))))


async def reserve(
    *,
    session: AsyncSession,
    request_id: str,
    tenant_id: str,
    api_key_id: str | None,
    amount_pico: int,
    now: datetime | None = None,
    limits: Limits | None = None,
    pending: Mapping[CounterKey, int] | None = None,
) -> Reservation | None:
    """Hold `amount_pico` against every limited counter, or raise BudgetExceededError.

    `limits`: from limits_for() if the caller already has them. `pending`: spend per counter
    the database does not know yet (admitted while it was away), counted but not held.
    Returns None when no limit applies (nothing to hold). On refusal the caller must
    roll back, undoing holds already taken on other counters. Caller commits.
    """
    if amount_pico < 0:
        raise BudgetError("a reservation must not be negative")
    now = now or utcnow()
    month = month_start(now)
    if limits is None:
        limits = await limits_for(session=session, tenant_id=tenant_id, api_key_id=api_key_id, month=month)
    if not limits.checks:
        return None
    balances: list[int] = []
    for counter, limit in limits.checks:
        await _ensure_counter(session, counter)
        row = _counter_row(counter)
        # The room is computed here, not as spent + reserved + amount in SQL, so no sum can
        # overflow the database's 64-bit integers however large the limit.
        room = limit - amount_pico - (pending or {}).get(counter, 0)
        held = (
            await session.execute(
                update(BudgetCounter)
                .where(row, BudgetCounter.spent_pico + BudgetCounter.reserved_pico <= room)
                .values(reserved_pico=BudgetCounter.reserved_pico + amount_pico)
                .returning(BudgetCounter.spent_pico, BudgetCounter.reserved_pico)
                .execution_options(synchronize_session=False)
            )
        ).first()
        if held is None:
            state = await session.scalar(select(BudgetCounter).where(row))
            assert state is not None
            raise BudgetExceededError(
                scope=counter.scope,
                limit_pico=limit,
                spent_pico=state.spent_pico,
                reserved_pico=state.reserved_pico,
                needed_pico=amount_pico,
            )
        balances.append(held.spent_pico + held.reserved_pico)
    counters = tuple(counter for counter, _ in limits.checks)
    session.add(
        BudgetReservation(
            request_id=request_id,
            tenant_id=tenant_id,
            api_key_id=api_key_id,
            period=period_key(month),
            amount_pico=amount_pico,
            scopes=",".join(c.scope for c in counters),
            created_at=now,
        )
    )
    await session.flush()
    return Reservation(request_id=request_id, amount_pico=amount_pico, counters=counters, balances=tuple(balances))


def counter_order(counter: CounterKey) -> tuple[str, str, str]:
    """The one order every transaction takes counter row locks in (admission, release, spend,
    settlement, spool replay), so no two of them can wait on each other in a cycle."""
    return (counter.scope, counter.owner_id, counter.period)


def spend_counters(*, tenant_id: str, api_key_id: str | None, billing_month: date) -> list[CounterKey]:
    """The counters add_spend() moves for an entry of this tenant and key in this month, in lock order."""
    counters = [
        CounterKey(TENANT_MONTH, tenant_id, period_key(billing_month)),
        CounterKey(TENANT_CREDIT, tenant_id, ALL_TIME),
    ]
    if api_key_id is not None:
        counters.append(CounterKey(KEY_MONTH, api_key_id, period_key(billing_month)))
    return sorted(counters, key=counter_order)


async def lock_reservation(*, session: AsyncSession, request_id: str) -> BudgetReservation | None:
    """Lock a request's reservation row (if it has one) before any counter: release() and the stale
    sweep take the reservation first too, so settling cannot deadlock with them."""
    return await session.scalar(
        select(BudgetReservation).where(BudgetReservation.request_id == request_id).with_for_update()
    )


def reservation_counters(reservation: BudgetReservation) -> list[CounterKey]:
    return _reservation_counters(reservation)


async def lock_counters(*, session: AsyncSession, counters: Iterable[CounterKey]) -> None:
    """Create (if missing) and row-lock these counters, one at a time in counter_order.

    A settlement touches counters in two passes (release, then spend) whose sorted orders
    differ when the reservation held only some of them; taking every lock up front in one
    order is what keeps live settlements and spool replays from deadlocking on budget_counters.
    SQLite has one write lock for the whole database: FOR UPDATE is not emitted there.
    """
    for counter in sorted(set(counters), key=counter_order):
        await _ensure_counter(session, counter)
        await session.execute(select(BudgetCounter.scope).where(_counter_row(counter)).with_for_update())


async def release(*, session: AsyncSession, request_id: str) -> int:
    """Drop a request's reservation (if any) from its counters; returns the amount released."""
    reservation = await session.scalar(
        select(BudgetReservation).where(BudgetReservation.request_id == request_id).with_for_update()
    )
    if reservation is None:
        return 0
    deleted = await session.execute(delete(BudgetReservation).where(BudgetReservation.request_id == request_id))
    if deleted.rowcount != 1:  # type: ignore[attr-defined]
        return 0  # another transaction released it first
    for counter in _reservation_counters(reservation):
        await session.execute(
            update(BudgetCounter)
            .where(_counter_row(counter))
            .values(reserved_pico=BudgetCounter.reserved_pico - reservation.amount_pico)
        )
    return reservation.amount_pico


async def add_spend(
    *, session: AsyncSession, tenant_id: str, api_key_id: str | None, billing_month: date, cost_pico: int
) -> None:
    """Count settled spend on every counter of the tenant and key, limited or not.

    Counting always (not only under a limit) means a limit set mid-month starts
    from the month's real spend.
    """
    if cost_pico == 0:
        return
    for counter in spend_counters(tenant_id=tenant_id, api_key_id=api_key_id, billing_month=billing_month):
        await _ensure_counter(session, counter)
        await session.execute(
            update(BudgetCounter).where(_counter_row(counter)).values(spent_pico=BudgetCounter.spent_pico + cost_pico)
        )


async def stale_reservations(*, session: AsyncSession, older_than: timedelta, now: datetime | None = None) -> list[str]:
    cutoff = (now or utcnow()) - older_than
    return list(
        (await session.scalars(select(BudgetReservation.request_id).where(BudgetReservation.created_at < cutoff))).all()
    )


async def budget_status(*, session: AsyncSession, tenant_id: str, now: datetime | None = None) -> BudgetStatus:
    month = period_key(month_start(now or utcnow()))
    budget = await session.get(TenantBudget, tenant_id)
    limit = budget.monthly_limit_pico if budget else None
    prepaid = bool(budget and budget.prepaid)
    granted = budget.credit_granted_pico if budget else 0
    month_row = await session.scalar(
        select(BudgetCounter).where(_counter_row(CounterKey(TENANT_MONTH, tenant_id, month)))
    )
    credit_row = await session.scalar(
        select(BudgetCounter).where(_counter_row(CounterKey(TENANT_CREDIT, tenant_id, ALL_TIME)))
    )
    return BudgetStatus(
        tenant_id=tenant_id,
        monthly_limit_pico=limit,
        prepaid=prepaid,
        credit_granted_pico=granted,
        month=_state(TENANT_MONTH, month, limit, month_row),
        credit=_state(TENANT_CREDIT, ALL_TIME, granted if prepaid else None, credit_row),
        keys=await _key_states(session, tenant_id, month),
    )


async def _key_states(session: AsyncSession, tenant_id: str, month: str) -> tuple[KeyLimitState, ...]:
    counter = (
        (BudgetCounter.scope == KEY_MONTH) & (BudgetCounter.owner_id == ApiKey.id) & (BudgetCounter.period == month)
    )
    rows = await session.execute(
        select(ApiKey, KeyBudget.monthly_limit_pico, BudgetCounter)
        .outerjoin(KeyBudget, KeyBudget.api_key_id == ApiKey.id)
        .outerjoin(BudgetCounter, counter)
        .where(ApiKey.tenant_id == tenant_id)
        .order_by(ApiKey.name, ApiKey.id)
    )
    states = []
    for key, limit, row in rows.all():
        state = _state(KEY_MONTH, month, limit, row)
        if key.revoked_at is None or state.spent_pico or state.reserved_pico:
            states.append(KeyLimitState(key.id, key.name, key.revoked_at is not None, state))
    return tuple(states)


async def key_limits(
    *, session: AsyncSession, tenant_id: str, api_key_id: str, now: datetime | None = None
) -> list[CounterState]:
    """Every limit a key's requests are held to now (its tenant's month and prepaid credit, its own
    month), each with its counter: what admission checks, so the tightest is what the key has left."""
    month = month_start(now or utcnow())
    limits = await limits_for(session=session, tenant_id=tenant_id, api_key_id=api_key_id, month=month)
    states = []
    for counter, limit in limits.checks:
        row = await session.scalar(select(BudgetCounter).where(_counter_row(counter)))
        states.append(_state(counter.scope, counter.period, limit, row))
    return states


def _state(scope: str, period: str, limit: int | None, row: BudgetCounter | None) -> CounterState:
    return CounterState(
        scope=scope,
        period=period,
        limit_pico=limit,
        spent_pico=row.spent_pico if row else 0,
        reserved_pico=row.reserved_pico if row else 0,
    )


def _reservation_counters(reservation: BudgetReservation) -> list[CounterKey]:
    owners = {
        TENANT_MONTH: reservation.tenant_id,
        TENANT_CREDIT: reservation.tenant_id,
        KEY_MONTH: reservation.api_key_id,
    }
    periods = {TENANT_MONTH: reservation.period, KEY_MONTH: reservation.period, TENANT_CREDIT: ALL_TIME}
    scopes = [s for s in reservation.scopes.split(",") if s]
    return sorted((CounterKey(s, owners[s] or "", periods[s]) for s in scopes), key=counter_order)


async def _ensure_counter(session: AsyncSession, counter: CounterKey) -> None:
    await insert_ignore(
        session,
        BudgetCounter,
        {
            "scope": counter.scope,
            "owner_id": counter.owner_id,
            "period": counter.period,
            "spent_pico": 0,
            "reserved_pico": 0,
        },
        ["scope", "owner_id", "period"],
    )


def _counter_row(counter: CounterKey):  # type: ignore[no-untyped-def]
    return (
        (BudgetCounter.scope == counter.scope)
        & (BudgetCounter.owner_id == counter.owner_id)
        & (BudgetCounter.period == counter.period)
    )
