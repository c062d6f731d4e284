"""Billing as the gateway sees it: the BillingHooks seam (admit, release, settle, allows_ttl),
a usage-recorder wrapper that spools when the database is away, and the upkeep task.

kvgate.app (the composition root) hands create_billing_hooks to the gateway, which calls
create_billing_hooks(sessions=..., settings=...) in its lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from decimal import Decimal
from pathlib import Path

import structlog
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import catalog
from billing.ledger import UsageCharge
from billing.metrics import BillingMetrics
from billing.money import pico_to_usd
from billing.pricebook import PriceBook
from billing.prices import load_price_file
from billing.service import BillingService, BudgetUnavailableError
from billing.settings import BillingSettings
from gateway.billing_hooks import Admission
from gateway.usage import UsageRecorder
from kvgate.db import create_engine, session_factory
from kvgate.db_health import is_database_unavailable
from kvgate.errors import DATABASE_RETRY_AFTER_S, DatabaseUnavailableError
from kvgate.settings import KvgateSettings
from kvgate.usage import REFUSED, STANDARD_TTLS_S, TTL_BY_SECONDS, UsageEvent, billed_counts

log = structlog.get_logger(__name__)


def charge_from_event(event: UsageEvent) -> UsageCharge:
    return UsageCharge(
        request_id=event.request_id,
        tenant_id=event.tenant_id,
        api_key_id=event.api_key_id,
        model=event.model,
        endpoint=event.endpoint,
        status=event.status,
        started_at=event.started_at,
        counts=billed_counts(event.counts, status=event.status),
        ttft_ms=event.ttft_ms,
        latency_ms=event.latency_ms,
        batch=event.batch,
    )


class GatewayBilling:
    """The gateway's BillingHooks, backed by a BillingService."""

    def __init__(self, service: BillingService) -> None:
        self.service = service
        # Requests whose usage record went to the spool: settle() must not write them a second time.
        self._spooled: set[str] = set()
        self._stop = asyncio.Event()
        self._upkeep: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._upkeep is None:
            self._upkeep = asyncio.get_running_loop().create_task(self.service.run_upkeep(self._stop))

    async def aclose(self) -> None:
        self._stop.set()
        if self._upkeep is not None:
            with contextlib.suppress(Exception):
                await self._upkeep
            self._upkeep = None

    @property
    def metrics(self) -> BillingMetrics:
        """Billing's counters, for the gateway to serve on /metrics (gateway.billing_hooks)."""
        return self.service.metrics

    async def admit(self, admission: Admission) -> None:
        # A refusal is a BudgetExceededError: a BillingError the gateway renders (402, or 429 on OpenAI's API).
        try:
            await self.service.admit(
                request_id=admission.request_id,
                tenant_id=admission.tenant_id,
                api_key_id=admission.api_key_id,
                model=admission.model,
                prompt_tokens=admission.prompt_tokens,
                max_output_tokens=admission.max_output_tokens,
                write_ttls_s=admission.write_ttls_s,
            )
        except BudgetUnavailableError as exc:
            raise DatabaseUnavailableError(
                "the database is unavailable and this request's budget cannot be checked; retry after the time "
                "in the retry-after header",
                retry_after_s=DATABASE_RETRY_AFTER_S,
            ) from exc

    async def release(self, admission: Admission) -> None:
        await self.service.release(request_id=admission.request_id)

    async def settle(self, event: UsageEvent) -> Decimal | None:
        charge = charge_from_event(event)
        if event.request_id in self._spooled:
            self._spooled.discard(event.request_id)
            return pico_to_usd(self.service.quote(charge).cost_pico)
        return pico_to_usd((await self.service.settle(charge)).cost_pico)

    def allows_ttl(self, *, model: str, ttl_s: int) -> bool:
        if ttl_s in STANDARD_TTLS_S:
            return True
        ttl = TTL_BY_SECONDS.get(ttl_s)
        return ttl is not None and self.service.allows_ttl(model=model, ttl=ttl.name)

    async def replay_pending(self, *, timeout_s: float = 30.0) -> None:
        """Replay the spool now (the gateway calls this before recovering a crashed process's requests).

        Waits while another process holds the replay; gives up on a database outage, since
        then anything recovery spools queues behind what is already there.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await asyncio.to_thread(self.service.spool.has_pending):
            try:
                result = await self.service.replay_spool()
            except Exception as error:
                level = log.warning if is_database_unavailable(error) else log.error
                level("billing.startup_replay_deferred", error=str(error))
                return
            if result.files:
                log.info("billing.spool_replayed", **asdict(result))
                continue
            if loop.time() > deadline:  # another replayer, still at it
                log.warning("billing.startup_replay_deferred", error="another process is replaying the spool")
                return
            await asyncio.sleep(0.1)

    def wrap_recorder(self, recorder: UsageRecorder) -> UsageRecorder:
        return SpoolingUsageRecorder(recorder, self)

    async def spool_event(self, event: UsageEvent) -> None:
        await self.service.spool_with_usage_record(charge_from_event(event), event.as_row())
        self._spooled.add(event.request_id)


class SpoolingUsageRecorder:
    """The gateway's recorder, with the spool behind it: a record the database cannot take now is
    kept on local disk and reported as recorded, so billing still settles (and prices) it."""

    def __init__(self, inner: UsageRecorder, billing: GatewayBilling) -> None:
        self._inner = inner
        self._billing = billing

    async def record(self, event: UsageEvent) -> bool:
        health = self._billing.service.health
        # While the database is known to be away, straight to the spool: no wait for a timeout.
        if health.should_try():
            try:
                recorded = await self._inner.record(event)
            except Exception as error:
                if not health.observe(error):
                    raise
            else:
                health.succeeded()
                return recorded
        if event.status == REFUSED:  # no usage to bill: not spooled (gateway/refusals.py)
            return False
        await self._billing.spool_event(event)
        log.debug("billing.usage_record_spooled", request_id=event.request_id)
        return True


def default_spool_path(database_url: str) -> Path:
    """Beside a SQLite database file; otherwise under .kvgate/, one spool per database."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        return Path(url.database).with_name(Path(url.database).name + ".usage-spool.jsonl")
    import hashlib

    digest = hashlib.sha256(url.render_as_string(hide_password=True).encode()).hexdigest()[:12]
    return Path(".kvgate") / f"usage-spool-{digest}.jsonl"


SEED_ATTEMPTS = 3


def _prepare_catalog(database_url: str, settings: BillingSettings) -> PriceBook:
    """Seed and load the price catalog on a private loop and engine (the lifespan calls us synchronously)."""

    async def run() -> PriceBook:
        engine = create_engine(database_url)
        specs = load_price_file(settings.prices_file)
        try:
            for attempt in range(SEED_ATTEMPTS):
                try:
                    async with session_factory(engine)() as session:
                        await catalog.seed_prices(session=session, specs=specs, source=settings.prices_file.name)
                        await session.commit()
                        return await catalog.load_pricebook(session=session)
                except (catalog.PriceConflictError, IntegrityError):
                    # Gateways starting together seed the same file at once: one inserts, the others
                    # clash with its rows. Seeding again reads them and finds nothing to add; a file
                    # that really conflicts with the catalog fails every attempt.
                    if attempt + 1 == SEED_ATTEMPTS:
                        raise
            raise AssertionError("unreachable")
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="billing-seed") as pool:
        return pool.submit(lambda: asyncio.run(run())).result()


def create_billing_hooks(
    *,
    sessions: async_sessionmaker[AsyncSession],
    settings: KvgateSettings,
    billing_settings: BillingSettings | None = None,
) -> GatewayBilling:
    billing_settings = billing_settings or BillingSettings()
    if "spool_path" not in billing_settings.model_fields_set:
        billing_settings = billing_settings.model_copy(update={"spool_path": default_spool_path(settings.database_url)})
    book = _prepare_catalog(settings.database_url, billing_settings)
    service = BillingService(
        sessions=sessions, settings=billing_settings, pricebook=book, write_timeout_s=settings.usage_write_timeout_s
    )
    hooks = GatewayBilling(service)
    with contextlib.suppress(RuntimeError):  # no running loop: the caller starts upkeep itself
        hooks.start()
    return hooks
