"""The background evaluator: every interval, each tenant with alerts on is read, the rules say what is due,
new alerts are stored with their deliveries (dedupe on tenant, kind and period, so a restart or a second
gateway never fires one twice), then due deliveries are sent. It runs in `kvgate serve`'s lifespan
(kvgate/app.py); a slow webhook receiver holds one of a bounded number of delivery slots, never a request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from alerts import kinds, readings, rules, store
from alerts.delivery import Clock, Deliverer
from alerts.models import AlertSettingsRow
from kvgate.db import utcnow

log = structlog.get_logger(__name__)
Sleep = Callable[[float], Awaitable[None]]


async def due_alerts(session: AsyncSession, alerts: store.TenantAlerts, *, now: datetime) -> list[rules.Fired]:
    """What the tenant's enabled rules find at `now` (each hour rule looks at the last whole hour)."""
    on = set(alerts.kinds)
    tenant_id = alerts.tenant_id
    fired: list[rules.Fired] = []
    if on & {kinds.BUDGET_80, kinds.BUDGET_100}:
        budgets = await readings.budget_readings(session, tenant_id=tenant_id, now=now)
        fired += [f for f in rules.budget_alerts(budgets) if f.kind in on]
    this_hour = readings.hour_start(now)
    if kinds.REFUSALS in on:
        refused = await readings.refusals_since(session, tenant_id=tenant_id, since=this_hour, until=now)
        fired += rules.refusal_alert(refusals=refused, hour=this_hour)
    last_hour = this_hour - timedelta(hours=1)
    if kinds.CACHE_DROP in on:
        hour = await readings.cache_window(session, tenant_id=tenant_id, start=last_hour, end=this_hour)
        day = await readings.cache_window(
            session, tenant_id=tenant_id, start=last_hour - timedelta(hours=rules.TRAILING_HOURS), end=last_hour
        )
        fired += rules.cache_drop_alert(hour=hour, baseline=day, hour_start=last_hour)
    if kinds.SPEND_ANOMALY in on:
        spend, trailing = await readings.spend_window(session, tenant_id=tenant_id, hour=last_hour)
        fired += rules.spend_anomaly_alert(hour_spend_pico=spend, trailing_pico=trailing, hour_start=last_hour)
    return fired


class AlertEvaluator:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        deliverer: Deliverer,
        *,
        interval_s: float = 60.0,
        clock: Clock = utcnow,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.sessions = sessions
        self.deliverer = deliverer
        self.interval_s = interval_s
        self.clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    async def evaluate_once(self) -> list[str]:
        """Fire what is due for every tenant with alerts on; returns the new alerts' event ids."""
        now = self.clock()
        async with self.sessions() as session:
            tenant_ids = list(
                await session.scalars(select(AlertSettingsRow.tenant_id).where(AlertSettingsRow.kinds != ""))
            )
        new: list[str] = []
        for tenant_id in tenant_ids:
            try:
                async with self.sessions() as session:
                    alerts = await store.tenant_alerts(session, tenant_id)
                    for fired in await due_alerts(session, alerts, now=now):
                        event_id = await store.fire(session, alerts=alerts, fired=fired, now=now)
                        if event_id is not None:
                            new.append(event_id)
                            log.info("alerts.fired", tenant_id=tenant_id, kind=fired.kind, period=fired.period)
                    await session.commit()
            except Exception:  # one tenant's failure must not hold back the others' alerts
                log.exception("alerts.evaluation_failed", tenant_id=tenant_id)
        return new

    async def tick(self) -> None:
        await self.evaluate_once()
        await self.deliverer.deliver_due()

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as error:  # the database may be away: try again next interval
                log.warning("alerts.tick_failed", error=str(error))
            await self._sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self.deliverer.aclose()
