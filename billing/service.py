"""BillingService: what the gateway calls per request (admit, settle) and the background upkeep.

It prices from an in-memory PriceBook, so a request's cost is known even while the
database is away; then the settlement is spooled to disk instead of written, and
replayed (exactly once, by request id) when the database answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import budgets, catalog, invoices, spool_records
from billing.budgets import BudgetExceededError, Reservation
from billing.finalization import finalize_due
from billing.ledger import UsageCharge
from billing.metrics import BillingMetrics
from billing.outage_budgets import BudgetUnknownError, OutageBudgets
from billing.periods import month_start
from billing.pricebook import NoPriceError, PriceBook
from billing.prices import PriceVersion
from billing.retries import retry_conflicts
from billing.settings import BillingSettings
from billing.settlement import Settlement, settle_charge
from billing.spool import ReplayResult, Spool
from billing.spool_replay import SpoolReplayer
from kvgate.db import utcnow
from kvgate.db_health import DatabaseHealth, health_of, is_database_unavailable, is_transaction_conflict
from kvgate.usage import TTL_CLASSES

__all__ = ["BillingService", "BudgetUnavailableError", "SettleOutcome", "is_database_unavailable"]

log = structlog.get_logger(__name__)


class BudgetUnavailableError(Exception):
    """The database cannot be reached and the request's budget cannot be checked from memory
    (budget_fail_open is off, or this tenant was never admitted since start-up): retry later."""


@dataclass(frozen=True)
class SettleOutcome:
    cost_pico: int
    price_version_id: int
    spooled: bool
    duplicate: bool


class BillingService:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        settings: BillingSettings,
        pricebook: PriceBook,
        clock: Callable[[], datetime] = utcnow,
        health: DatabaseHealth | None = None,
        write_timeout_s: float | None = None,
    ) -> None:
        """write_timeout_s: how long a live settlement may take before its record goes to the spool
        instead (KVGATE_USAGE_WRITE_TIMEOUT_S); None: the database timeouts alone bound it."""
        self.sessions = sessions
        self.write_timeout_s = write_timeout_s
        # Live settlements that outlived write_timeout_s, still running (their record is spooled).
        self._late: set[asyncio.Task[Settlement]] = set()
        self.settings = settings
        self.pricebook = pricebook
        self.spool = Spool(settings.spool_path)
        self._clock = clock
        # Shared with the gateway when both use one session factory: one view of the outage.
        self.health = health or health_of(sessions)
        self.outage = OutageBudgets()
        # This service's counters, served on /metrics by the app that uses it (billing.metrics).
        self.metrics = BillingMetrics(tenant_label=settings.metrics_tenant_label)
        # Releases the database could not take (the engine refused a request during an outage).
        self._deferred_releases: set[str] = set()
        self._replayer = SpoolReplayer(
            sessions=sessions, spool=self.spool, metrics=self.metrics, version_by_id=self._version_by_id, clock=clock
        )

    @classmethod
    async def start(
        cls,
        *,
        sessions: async_sessionmaker[AsyncSession],
        settings: BillingSettings,
        seed: bool = True,
        clock: Callable[[], datetime] = utcnow,
    ) -> BillingService:
        """Seed the price catalog from the TOML file and load it (the database must be up at start)."""
        async with sessions() as session:
            if seed:
                from billing.prices import load_price_file

                result = await catalog.seed_prices(
                    session=session,
                    specs=load_price_file(settings.prices_file),
                    source=settings.prices_file.name,
                )
                await session.commit()
                if result.created:
                    log.info("billing.prices_seeded", created=len(result.created))
            book = await catalog.load_pricebook(session=session)
        return cls(sessions=sessions, settings=settings, pricebook=book, clock=clock)

    # -- pricing -------------------------------------------------------------------

    def price_for(self, model: str, at: datetime) -> PriceVersion:
        return self.pricebook.price_for(model, at)

    def allows_ttl(self, *, model: str, ttl: str, at: datetime | None = None) -> bool:
        try:
            return ttl in self.price_for(model, at or self._clock()).ttl_classes
        except NoPriceError:
            return False

    def estimate_pico(
        self,
        *,
        model: str,
        prompt_tokens: int,
        max_output_tokens: int,
        at: datetime,
        write_ttls_s: Collection[int] | None = None,
    ) -> int:
        """Upper bound on a request's cost: every prompt token at the dearest rate it may be billed at
        (input, or a write in one of `write_ttls_s`; None: any TTL class), and all output."""
        rates = self.price_for(model, at).rates
        classes = [t for t in TTL_CLASSES if write_ttls_s is None or t.seconds in write_ttls_s]
        prompt_rates = (rates.input, *(getattr(rates, t.category.value) for t in classes))
        dearest = max(rate for rate in prompt_rates if rate is not None)
        return max(0, prompt_tokens) * dearest + max(0, max_output_tokens) * rates.output

    async def refresh_prices(self) -> None:
        async with self.sessions() as session:
            self.pricebook = await catalog.load_pricebook(session=session)

    # -- per request -----------------------------------------------------------------

    async def admit(
        self,
        *,
        request_id: str,
        tenant_id: str,
        api_key_id: str | None,
        model: str,
        prompt_tokens: int,
        max_output_tokens: int,
        write_ttls_s: Collection[int] | None = None,
    ) -> Reservation | None:
        """Reserve the worst case, or raise BudgetExceededError before the engine runs.

        write_ttls_s: the TTLs of the cache regions the request may write (None: any class).

        While the database is away the reservation is held in memory against the budget's
        last-known state (billing.outage_budgets); BudgetUnavailableError if it cannot be.
        """
        now = self._clock()
        amount = self.estimate_pico(
            model=model,
            prompt_tokens=prompt_tokens,
            max_output_tokens=max_output_tokens,
            at=now,
            write_ttls_s=write_ttls_s,
        )
        if self.health.should_try():
            try:
                return await self._admit_online(
                    request_id=request_id, tenant_id=tenant_id, api_key_id=api_key_id, amount=amount, now=now
                )
            except BudgetExceededError:
                raise
            except Exception as error:
                if not self.health.observe(error):
                    raise
        if not self.settings.budget_fail_open:
            raise BudgetUnavailableError("budgets cannot be checked while the database is unavailable")
        try:
            self.outage.admit(
                request_id=request_id, tenant_id=tenant_id, api_key_id=api_key_id, amount_pico=amount, now=now
            )
        except BudgetUnknownError as exc:
            raise BudgetUnavailableError(str(exc)) from exc
        self.metrics.fail_open.inc()
        log.debug("billing.admitted_from_memory", request_id=request_id, tenant_id=tenant_id)
        return None

    async def _admit_online(
        self, *, request_id: str, tenant_id: str, api_key_id: str | None, amount: int, now: datetime
    ) -> Reservation | None:
        async with self.sessions() as session:
            limits = await budgets.limits_for(
                session=session, tenant_id=tenant_id, api_key_id=api_key_id, month=month_start(now)
            )
            try:
                reservation = await budgets.reserve(
                    session=session,
                    request_id=request_id,
                    tenant_id=tenant_id,
                    api_key_id=api_key_id,
                    amount_pico=amount,
                    now=now,
                    limits=limits,
                    pending=self.outage.pending(),
                )
            except BudgetExceededError:
                await session.rollback()
                raise
            await session.commit()
        self.health.succeeded()
        self.outage.remember(
            tenant_id=tenant_id,
            api_key_id=api_key_id,
            limits=limits,
            balances=reservation.balances if reservation else (),
        )
        return reservation

    async def release(self, *, request_id: str) -> None:
        """Undo an admission whose request never ran; deferred to upkeep while the database is away."""
        self.outage.release(request_id=request_id)
        if self.health.should_try():
            try:
                async with self.sessions() as session:
                    await budgets.release(session=session, request_id=request_id)
                    await session.commit()
                self.health.succeeded()
                return
            except Exception as error:
                if not self.health.observe(error):
                    raise
        self._deferred_releases.add(request_id)

    async def _release_deferred(self) -> None:
        for request_id in list(self._deferred_releases):
            async with self.sessions() as session:
                await budgets.release(session=session, request_id=request_id)
                await session.commit()
            self._deferred_releases.discard(request_id)

    async def settle(self, charge: UsageCharge) -> SettleOutcome:
        """Write the ledger entry and settle the budget, or spool it: the settlement is durable (in the
        database or in the spool file) before this returns, whatever the database does.

        It goes to the spool when the database is away, when it takes longer than write_timeout_s,
        and when it keeps losing transaction races (deadlock, serialization failure) after
        billing.retries' bounded retries. The upkeep loop replays the spool without a restart.
        """
        version = self.price_for(charge.model, charge.started_at)
        if self.health.should_try():
            try:
                settlement = await self._settle_live(charge, version)
            except Exception as error:
                if is_transaction_conflict(error):
                    # The database is there (no outage to report): this request just kept losing.
                    self.metrics.conflicts.labels(outcome="spooled").inc()
                    log.warning("billing.settlement_conflict_spooled", request_id=charge.request_id, error=str(error))
                elif not self.health.observe(error):
                    raise
            else:
                self.health.succeeded()
                self.metrics.settled(charge, version, settlement)
                self.outage.settled(request_id=charge.request_id, cost_pico=settlement.cost_pico)
                return SettleOutcome(
                    cost_pico=settlement.cost_pico,
                    price_version_id=version.id,
                    spooled=False,
                    duplicate=not settlement.inserted,
                )
        await asyncio.to_thread(self.spool.append, spool_records.spool_record(charge, version))
        self.metrics.spooled.inc()
        cost = version.cost_pico(charge.counts, batch=charge.batch)
        self.outage.spooled(request_id=charge.request_id, cost_pico=cost)
        log.debug("billing.settlement_spooled", request_id=charge.request_id)
        return SettleOutcome(cost_pico=cost, price_version_id=version.id, spooled=True, duplicate=False)

    async def _settle_live(self, charge: UsageCharge, version: PriceVersion) -> Settlement:
        """One live settlement, retried on transaction conflicts; TimeoutError past write_timeout_s."""

        async def attempt() -> Settlement:
            async with self.sessions() as session:
                settlement = await settle_charge(
                    session=session, charge=charge, version=version, source="live", now=self._clock()
                )
                await session.commit()
            return settlement

        def retried(_: BaseException) -> None:
            self.metrics.conflicts.labels(outcome="retried").inc()

        work = asyncio.ensure_future(retry_conflicts(attempt, what="settlement", on_retry=retried))
        if self.write_timeout_s is None:
            return await work
        # Not cancelled on timeout: cancelling a session mid-statement on a stalled connection would
        # wait on its rollback as long as the statement itself. It runs on, and if it commits late
        # the replay of the spooled copy finds the ledger entry and adds nothing (unique request id).
        done, _ = await asyncio.wait({work}, timeout=self.write_timeout_s)
        if work in done:
            return work.result()
        self._late.add(work)
        work.add_done_callback(self._late_settlement_done)
        raise TimeoutError(f"the settlement took longer than {self.write_timeout_s} s")

    def _late_settlement_done(self, task: asyncio.Task[Settlement]) -> None:
        self._late.discard(task)
        if not task.cancelled() and task.exception() is not None:  # its spooled copy stands in for it
            log.debug("billing.late_settlement_failed", error=str(task.exception()))

    def quote(self, charge: UsageCharge) -> SettleOutcome:
        """The cost of a charge from the in-memory catalog, touching no database."""
        version = self.price_for(charge.model, charge.started_at)
        cost = version.cost_pico(charge.counts, batch=charge.batch)
        return SettleOutcome(cost_pico=cost, price_version_id=version.id, spooled=True, duplicate=False)

    async def spool_with_usage_record(self, charge: UsageCharge, usage_record: dict[str, Any]) -> SettleOutcome:
        """Spool a request whose usage record (the gateway's usage_records row) could not be written
        either; replay writes both, in one transaction."""
        version = self.price_for(charge.model, charge.started_at)
        record = {**spool_records.spool_record(charge, version), "usage_record": spool_records.jsonable(usage_record)}
        await asyncio.to_thread(self.spool.append, record)
        self.metrics.spooled.inc()
        outcome = self.quote(charge)
        self.outage.spooled(request_id=charge.request_id, cost_pico=outcome.cost_pico)
        return outcome

    async def replay_spool(self) -> ReplayResult:
        try:
            result = await self.spool.replay(self._replayer.apply)
        except Exception as error:
            if not is_transaction_conflict(error):  # a lost race is no outage
                self.health.observe(error)
            raise
        if result.records:  # they reached the database: it is back
            self.health.succeeded()
        if not self.spool.has_pending():
            self.outage.reconciled()  # the database now counts what was spent meanwhile
        return result

    async def _version_by_id(self, version_id: int) -> PriceVersion:
        try:
            return self.pricebook.by_id(version_id)
        except NoPriceError:
            await self.refresh_prices()  # added by another process since we loaded the catalog
            return self.pricebook.by_id(version_id)

    async def release_stale_reservations(self) -> int:
        released = 0
        async with self.sessions() as session:
            stale = await budgets.stale_reservations(
                session=session,
                older_than=timedelta(seconds=self.settings.reservation_timeout_s),
                now=self._clock(),
            )
            for request_id in stale:
                released += bool(await budgets.release(session=session, request_id=request_id))
            await session.commit()
        return released

    async def finalize_due_invoices(self, now: datetime | None = None) -> list[invoices.InvoiceView]:
        """Finalize every draft past its month plus the grace period, one transaction each."""
        return await finalize_due(sessions=self.sessions, settings=self.settings, now=now or self._clock())

    async def run_upkeep(self, stop: asyncio.Event) -> None:
        """Background loop: replay the spool; now and then reload prices, release stale reservations
        and finalize the invoices of months past their grace period."""
        last_refresh = asyncio.get_running_loop().time()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.spool_replay_interval_s)
            try:
                if self._deferred_releases:
                    await self._release_deferred()
                if self.spool.has_pending():
                    result = await self.replay_spool()
                    if result.records:
                        log.info("billing.spool_replayed", **asdict(result))
                now = asyncio.get_running_loop().time()
                if now - last_refresh >= self.settings.price_refresh_interval_s:
                    last_refresh = now
                    await self.refresh_prices()
                    await self.release_stale_reservations()
                    if self.settings.auto_finalize_invoices:
                        await self.finalize_due_invoices()
            except Exception as error:  # the loop must outlive a database outage
                if is_transaction_conflict(error):  # the replay kept losing races: the next round redoes it
                    log.warning("billing.spool_replay_conflict", error=str(error)[:300])
                elif self.health.observe(error):  # logged once per outage by the health
                    log.debug("billing.upkeep_failed", error=str(error))
                else:
                    log.exception("billing.upkeep_failed", error=str(error))
