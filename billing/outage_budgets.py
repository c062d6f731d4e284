"""Spend limits while the database is away: admission from memory, bounded by each budget.

Every admission that reaches the database leaves a snapshot here: which limited counters
apply to the tenant and key, their limits, and their spent + reserved balance right after
the hold. While the database cannot be reached, admission checks and holds the request's
worst case against that snapshot plus what was admitted and spent since:

    balance at the snapshot + spend not yet in the database + holds + this request <= limit

so a tenant can no longer run past its budget during an outage. A request admitted here
moves from held to unrecorded spend when it settles into the spool, and leaves memory
when its settlement reaches the database (live, or by the spool's replay: reconciled()).
Online admissions also count what memory knows and the database does not yet.

A tenant this process never admitted online has no snapshot: its budget is unknown, so
it is refused with a retryable error rather than admitted unchecked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from billing.budgets import ALL_TIME, KEY_MONTH, TENANT_CREDIT, BudgetExceededError, CounterKey, Limits
from billing.periods import month_start, period_key

Scope = tuple[str, str]  # (counter scope, owner id)


class BudgetUnknownError(Exception):
    """No admission of this tenant reached the database yet: its limits are unknown."""


@dataclass(frozen=True)
class _Hold:
    counters: tuple[CounterKey, ...]
    amount_pico: int


class OutageBudgets:
    def __init__(self) -> None:
        self._limits: dict[Scope, int] = {}
        self._scopes: dict[tuple[str, str | None], tuple[Scope, ...]] = {}
        self._tenant_scopes: dict[str, tuple[Scope, ...]] = {}
        self._balance: dict[CounterKey, int] = {}
        self._holds: dict[str, _Hold] = {}
        self._held: Counter[CounterKey] = Counter()
        self._unrecorded: Counter[CounterKey] = Counter()

    # -- what the database said ----------------------------------------------------------------

    def remember(self, *, tenant_id: str, api_key_id: str | None, limits: Limits, balances: tuple[int, ...]) -> None:
        """The state after an admission the database decided (balances: spent + reserved per check)."""
        scopes: list[Scope] = []
        for (counter, limit), balance in zip(limits.checks, balances, strict=True):
            scope = (counter.scope, counter.owner_id)
            scopes.append(scope)
            self._limits[scope] = limit
            self._balance[counter] = balance
        self._scopes[(tenant_id, api_key_id)] = tuple(scopes)
        self._tenant_scopes[tenant_id] = tuple(s for s in scopes if s[0] != KEY_MONTH)

    def pending(self) -> dict[CounterKey, int]:
        """Per counter, what memory holds and the database does not know yet."""
        return dict(self._held + self._unrecorded)

    # -- admission without the database ------------------------------------------------------

    def admit(
        self, *, request_id: str, tenant_id: str, api_key_id: str | None, amount_pico: int, now: datetime
    ) -> None:
        """Hold the request's worst case in memory, or raise BudgetExceededError / BudgetUnknownError."""
        scopes = self._scopes.get((tenant_id, api_key_id))
        if scopes is None:
            scopes = self._tenant_scopes.get(tenant_id)
        if scopes is None:
            raise BudgetUnknownError(f"no known budget for tenant {tenant_id}")
        period = period_key(month_start(now))
        counters = tuple(CounterKey(s, owner, ALL_TIME if s == TENANT_CREDIT else period) for s, owner in scopes)
        for counter in counters:
            limit = self._limits[(counter.scope, counter.owner_id)]
            spent = self._balance.get(counter, 0) + self._unrecorded[counter]
            if spent + self._held[counter] + amount_pico > limit:
                raise BudgetExceededError(
                    scope=counter.scope,
                    limit_pico=limit,
                    spent_pico=spent,
                    reserved_pico=self._held[counter],
                    needed_pico=amount_pico,
                )
        if counters:
            self._holds[request_id] = _Hold(counters=counters, amount_pico=amount_pico)
            for counter in counters:
                self._held[counter] += amount_pico

    # -- how requests end --------------------------------------------------------------------

    def _drop(self, request_id: str) -> _Hold | None:
        hold = self._holds.pop(request_id, None)
        if hold is not None:
            for counter in hold.counters:
                self._held[counter] -= hold.amount_pico
            self._held = +self._held  # drop zeros
        return hold

    def release(self, *, request_id: str) -> None:
        """The request never ran."""
        self._drop(request_id)

    def spooled(self, *, request_id: str, cost_pico: int) -> None:
        """Its settlement went to the spool: the real cost replaces the hold until replayed."""
        hold = self._drop(request_id)
        if hold is not None:
            for counter in hold.counters:
                self._unrecorded[counter] += cost_pico

    def settled(self, *, request_id: str, cost_pico: int) -> None:
        """Its settlement reached the database, which now counts the cost."""
        hold = self._drop(request_id)
        if hold is not None:
            for counter in hold.counters:
                self._balance[counter] = self._balance.get(counter, 0) + cost_pico

    def reconciled(self) -> None:
        """The spool has been replayed: the database now counts the unrecorded spend."""
        for counter, cost in self._unrecorded.items():
            self._balance[counter] = self._balance.get(counter, 0) + cost
        self._unrecorded.clear()
