"""The evaluator and the deliveries on a real database (SQLite and PostgreSQL), a real webhook receiver on a
loopback port and a real SMTP server: each alert fires once per period, across restarts too, reaches each
endpoint once (a retry after a 500 carries the same event id), and every attempt is logged."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

from aiosmtpd.controller import Controller
from sqlalchemy import select

from alerts import store
from alerts.delivery import MAX_ATTEMPTS, RETRY_DELAYS_S, Deliverer
from alerts.evaluator import AlertEvaluator
from alerts.kinds import BUDGET_80, BUDGET_100, KINDS, REFUSALS, SPEND_ANOMALY
from alerts.models import AlertAttempt, AlertDelivery, AlertEvent
from billing.budget_limits import set_key_budget, set_tenant_budget
from billing.budgets import add_spend
from billing.models import UsageRollup
from billing.money import PICO_PER_USD
from billing.periods import month_start
from kvgate.tenancy import UsageRecord
from tests.alerts.conftest import Clock, Receiver
from tests.billing.conftest import make_tenant
from tests.gateway.harness import free_port
from tests.web.test_mail import Inbox
from web.mail import send_mail
from web.settings import WebSettings

LIMIT = 100 * PICO_PER_USD


async def _tenant(sessions, *, kinds=KINDS, recipients=(), url: str | None = None) -> tuple[str, str, str | None]:
    tenant_id, (key_id,) = await make_tenant(sessions)
    secret = None
    async with sessions() as session:
        await store.save_settings(session, tenant_id=tenant_id, kinds=tuple(kinds), recipients=tuple(recipients))
        if url is not None:
            secret = (await store.add_endpoint(session, tenant_id=tenant_id, url=url, allow_private=True)).secret
        await session.commit()
    return tenant_id, key_id, secret


async def _spend(sessions, clock: Clock, tenant_id: str, key_id: str, pico: int) -> None:
    async with sessions() as session:
        await add_spend(
            session=session, tenant_id=tenant_id, api_key_id=key_id, billing_month=month_start(clock()), cost_pico=pico
        )
        await session.commit()


async def _events(sessions, tenant_id: str) -> list[AlertEvent]:
    async with sessions() as session:
        return await store.events_of(session, tenant_id=tenant_id)


async def _attempts(sessions, event_id: str) -> list[tuple[str, int, int | None, str | None]]:
    async with sessions() as session:
        rows = await session.execute(
            select(AlertDelivery.state, AlertAttempt.attempt, AlertAttempt.status_code, AlertAttempt.error)
            .join(AlertAttempt, AlertAttempt.delivery_id == AlertDelivery.id)
            .where(AlertDelivery.event_id == event_id)
            .order_by(AlertAttempt.attempt)
        )
        return [tuple(r) for r in rows.all()]


def _evaluator(sessions, clock: Clock, *, mail=None, allow_private: bool = True) -> AlertEvaluator:
    """Receivers in these tests are on loopback, which the operator allows here (alerts/addresses.py)."""
    deliverer = Deliverer(sessions, mail=mail, clock=clock, timeout_s=2, allow_private=allow_private)
    return AlertEvaluator(sessions, deliverer, clock=clock)


async def test_budget_80_fires_once_at_80_percent_not_at_79_and_not_again_after_a_restart(sessions, clock) -> None:
    tenant_id, key_id, _ = await _tenant(sessions, kinds=(BUDGET_80, BUDGET_100))
    async with sessions() as session:
        await set_tenant_budget(session=session, tenant_id=tenant_id, monthly_limit_pico=LIMIT)
        await session.commit()
    evaluator = _evaluator(sessions, clock)
    await _spend(sessions, clock, tenant_id, key_id, 79 * PICO_PER_USD)
    assert await evaluator.evaluate_once() == []
    await _spend(sessions, clock, tenant_id, key_id, PICO_PER_USD)  # 80% exactly
    (fired,) = await evaluator.evaluate_once()
    assert await evaluator.evaluate_once() == []
    restarted = _evaluator(sessions, clock)  # a new process: only the database remembers
    assert await restarted.evaluate_once() == []
    (event,) = await _events(sessions, tenant_id)
    assert event.id == fired and event.kind == BUDGET_80 and event.period.endswith(":2026-03")
    assert json.loads(event.body)["data"]["threshold_percent"] == 80
    # Next month the same budget may warn again.
    clock.advance(days=25)
    await _spend(sessions, clock, tenant_id, key_id, 80 * PICO_PER_USD)
    assert len(await restarted.evaluate_once()) == 1
    await evaluator.deliverer.aclose()
    await restarted.deliverer.aclose()


async def test_a_key_budget_warns_on_its_own(sessions, clock) -> None:
    tenant_id, key_id, _ = await _tenant(sessions, kinds=(BUDGET_80,))
    async with sessions() as session:
        await set_key_budget(
            session=session, tenant_id=tenant_id, api_key_id=key_id, monthly_limit_pico=10 * PICO_PER_USD
        )
        await session.commit()
    evaluator = _evaluator(sessions, clock)
    await _spend(sessions, clock, tenant_id, key_id, 7 * PICO_PER_USD)
    assert await evaluator.evaluate_once() == []
    await _spend(sessions, clock, tenant_id, key_id, PICO_PER_USD)
    assert len(await evaluator.evaluate_once()) == 1
    (event,) = await _events(sessions, tenant_id)
    assert event.period == f"key_month:{key_id}:2026-03" and "Key test's budget" in event.summary
    await evaluator.deliverer.aclose()


async def test_one_delivery_per_alert_retried_after_a_500_with_the_same_event_id(
    sessions, clock, receiver: Receiver
) -> None:
    tenant_id, key_id, secret = await _tenant(sessions, kinds=(BUDGET_80,), url=receiver.url)
    assert secret is not None
    receiver.secret = secret
    receiver.statuses = [500]
    async with sessions() as session:
        await set_tenant_budget(session=session, tenant_id=tenant_id, monthly_limit_pico=LIMIT)
        await session.commit()
    await _spend(sessions, clock, tenant_id, key_id, 90 * PICO_PER_USD)
    evaluator = _evaluator(sessions, clock)
    await evaluator.tick()  # fires and tries at once: the receiver answers 500
    assert [s["status"] for s in receiver.seen] == [500] and receiver.accepted == []
    clock.advance(seconds=RETRY_DELAYS_S[0] - 1)
    await evaluator.tick()  # not due yet, and nothing fires again
    assert len(receiver.seen) == 1
    clock.advance(seconds=1)
    await evaluator.tick()
    clock.advance(hours=1)
    await evaluator.tick()  # delivered: never sent again
    (event,) = await _events(sessions, tenant_id)
    assert [s["event_id"] for s in receiver.seen] == [event.id, event.id]
    (accepted,) = receiver.accepted
    assert accepted["body"]["id"] == event.id and accepted["body"]["type"] == "alert.budget_80"
    assert await _attempts(sessions, event.id) == [
        ("delivered", 1, 500, "the receiver answered 500"),
        ("delivered", 2, 200, None),
    ]
    async with sessions() as session:
        (view,) = await store.recent_deliveries(session, tenant_id=tenant_id)
    assert view.delivery.delivered_at == clock() - timedelta(hours=1) and len(view.attempts) == 2
    await evaluator.deliverer.aclose()


async def test_a_webhook_to_a_private_address_is_not_sent_unless_the_operator_allows_it(
    sessions, clock, receiver: Receiver
) -> None:
    """A name or address saved while allowed (or resolving elsewhere then) is checked again at each attempt."""
    tenant_id, key_id, secret = await _tenant(sessions, kinds=(BUDGET_100,), url=receiver.url)
    receiver.secret = secret
    async with sessions() as session:
        await set_tenant_budget(session=session, tenant_id=tenant_id, monthly_limit_pico=LIMIT)
        await session.commit()
    await _spend(sessions, clock, tenant_id, key_id, LIMIT)
    guarded = _evaluator(sessions, clock, allow_private=False)
    await guarded.tick()
    (event,) = await _events(sessions, tenant_id)
    ((state, attempt, status, error),) = await _attempts(sessions, event.id)
    assert (state, attempt, status) == ("pending", 1, None) and "not a public address" in (error or "")
    assert receiver.seen == []  # nothing reached the loopback receiver
    await guarded.deliverer.aclose()
    allowed = _evaluator(sessions, clock)
    clock.advance(seconds=RETRY_DELAYS_S[0])
    await allowed.tick()
    assert [s["body"]["id"] for s in receiver.accepted] == [event.id]
    await allowed.deliverer.aclose()


async def test_a_receiver_that_never_answers_gets_a_bounded_number_of_attempts(sessions, clock) -> None:
    dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    tenant_id, key_id, _ = await _tenant(sessions, kinds=(BUDGET_100,), url=dead)
    async with sessions() as session:
        await set_tenant_budget(session=session, tenant_id=tenant_id, monthly_limit_pico=LIMIT)
        await session.commit()
    await _spend(sessions, clock, tenant_id, key_id, LIMIT)
    evaluator = _evaluator(sessions, clock)
    await evaluator.tick()
    for delay in RETRY_DELAYS_S:
        clock.advance(seconds=delay)
        await evaluator.tick()
    clock.advance(hours=2)
    await evaluator.tick()
    (event,) = await _events(sessions, tenant_id)
    attempts = await _attempts(sessions, event.id)
    assert [a[1] for a in attempts] == list(range(1, MAX_ATTEMPTS + 1)) and MAX_ATTEMPTS == 6
    assert {a[0] for a in attempts} == {"failed"} and all(a[2] is None and a[3] for a in attempts)
    assert sum(RETRY_DELAYS_S) / 60 > 55  # the last attempt about an hour after the first
    await evaluator.deliverer.aclose()


async def test_alerts_are_mailed_through_the_dashboards_smtp(sessions, clock) -> None:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        settings = WebSettings(smtp_url=f"smtp://127.0.0.1:{port}", smtp_from="alerts@example.com")

        async def mail(*, to, subject, body) -> bool:
            return await send_mail(settings, to=to, subject=subject, body=body)

        tenant_id, key_id, _ = await _tenant(
            sessions, kinds=(REFUSALS,), recipients=("ops@example.com", "b@example.com")
        )
        evaluator = _evaluator(sessions, clock, mail=mail)
        async with sessions() as session:
            for status in ("ok", "refused"):
                session.add(_usage_record(tenant_id, key_id, clock, status=status))
            await session.commit()
        await evaluator.tick()
        (message,) = inbox.wait_for(1, timeout_s=10)
        assert message["To"] == "ops@example.com, b@example.com" and message["From"] == "alerts@example.com"
        assert "1 request(s) refused" in message["Subject"]
        (event,) = await _events(sessions, tenant_id)
        assert event.id in message.get_payload(decode=True).decode()
        await evaluator.tick()
        assert len(inbox.messages) == 1
    finally:
        controller.stop()
    await evaluator.deliverer.aclose()


def _usage_record(tenant_id: str, key_id: str, clock: Clock, *, status: str) -> UsageRecord:
    zeros = {c: 0 for c in ("input", "cache_write_5m", "cache_write_1h", "cache_read", "output")}
    return UsageRecord(
        request_id=f"req_{uuid.uuid4().hex}",
        tenant_id=tenant_id,
        api_key_id=key_id,
        model="m-test",
        endpoint="messages",
        started_at=clock() - timedelta(minutes=5),
        latency_ms=0,
        status=status,
        **{f"{c}_tokens": v for c, v in zeros.items()},
    )


async def test_refusals_alert_only_on_refused_records(sessions, clock) -> None:
    tenant_id, key_id, _ = await _tenant(sessions, kinds=(REFUSALS,))
    evaluator = _evaluator(sessions, clock)
    async with sessions() as session:
        session.add(_usage_record(tenant_id, key_id, clock, status="ok"))
        await session.commit()
    assert await evaluator.evaluate_once() == []
    async with sessions() as session:
        session.add(_usage_record(tenant_id, key_id, clock, status="refused"))
        await session.commit()
    assert len(await evaluator.evaluate_once()) == 1
    await evaluator.deliverer.aclose()


async def test_a_spend_anomaly_reads_the_hourly_rollups(sessions, clock) -> None:
    tenant_id, key_id, _ = await _tenant(sessions, kinds=(SPEND_ANOMALY,))
    last_hour = clock().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)

    def rollup(hour, cost_pico: int) -> UsageRollup:
        return UsageRollup(
            tenant_id=tenant_id,
            hour=hour,
            api_key_id=key_id,
            model="m-test",
            endpoint="messages",
            status="ok",
            requests=1,
            cost_pico=cost_pico,
            uncached_cost_pico=cost_pico,
        )

    async with sessions() as session:
        session.add_all(rollup(last_hour - timedelta(hours=h), PICO_PER_USD) for h in range(1, 25))
        session.add(rollup(last_hour, 4 * PICO_PER_USD))  # 4x the median hour: not yet an anomaly
        await session.commit()
    evaluator = _evaluator(sessions, clock)
    assert await evaluator.evaluate_once() == []
    async with sessions() as session:
        session.add(
            rollup(last_hour, 2 * PICO_PER_USD) | {} if False else _other_model(rollup(last_hour, PICO_PER_USD))
        )
        await session.commit()
    (fired,) = await evaluator.evaluate_once()
    (event,) = await _events(sessions, tenant_id)
    assert event.id == fired and event.period == last_hour.isoformat()
    assert json.loads(event.body)["data"]["spend_pico"] == 5 * PICO_PER_USD
    await evaluator.deliverer.aclose()


def _other_model(row: UsageRollup) -> UsageRollup:
    row.model = "m-other"
    return row
