"""Billing's counters (billing.metrics) on a real BillingService and database, rendered as /metrics renders them.

- spend and cache savings come from the ledger's own amounts: savings 0 for a request that
  wrote the cache, positive for one that read it; a repeated settlement is a duplicate, not spend;
- each service counts apart (nothing in prometheus_client's default registry);
- the tenant label can be switched off;
- no `_created` series.

The same counters through a real gateway's /metrics: tests/billing/test_metrics_endpoint.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from billing.ledger import UsageCharge
from billing.metrics import BillingMetrics
from billing.models import LedgerEntry
from billing.service import BillingService
from billing.settings import BillingSettings
from kvgate.metrics_text import render_text
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant

NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)
# m-test in the billing fixtures: $3 per Mtok of input; reads at 0.1x, so each read token saves $2.70 per Mtok.
SAVED_PER_READ_TOKEN = Decimal("2.70") / 10**6

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(metrics: BillingMetrics) -> tuple[str, Samples]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = render_text(registry)[0].decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def charge(tenant: str, key: str, request_id: str, counts: TokenCounts) -> UsageCharge:
    return UsageCharge(
        request_id=request_id,
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        endpoint="messages",
        status="ok",
        started_at=NOW,
        counts=counts,
    )


def service(sessions, pricebook, tmp_path: Path, **settings) -> BillingService:
    return BillingService(
        sessions=sessions,
        settings=BillingSettings(spool_path=tmp_path / "spool.jsonl", **settings),
        pricebook=pricebook,
        clock=lambda: NOW,
    )


async def ledger_cost_usd(sessions, tenant: str) -> Decimal:
    async with sessions() as session:
        costs = (await session.scalars(select(LedgerEntry.cost_pico).where(LedgerEntry.tenant_id == tenant))).all()
    assert costs
    return Decimal(sum(costs)).scaleb(-12)


async def test_spend_and_savings_follow_the_ledger_and_a_repeat_is_a_duplicate(sessions, pricebook, tmp_path):
    svc = service(sessions, pricebook, tmp_path)
    tenant, (key,) = await make_tenant(sessions)
    spend, savings = ("kvgate_spend_usd_total", "kvgate_cache_savings_usd_total")
    by_tenant = frozenset({("tenant", tenant)})

    cold = charge(tenant, key, f"cold-{tenant}", TokenCounts(input=100, cache_write_5m=2000, output=50))
    await svc.settle(cold)
    _, samples = scrape(svc.metrics)
    assert samples[(spend, by_tenant)] == pytest.approx(float(await ledger_cost_usd(sessions, tenant)), rel=1e-12)
    assert samples[(spend, by_tenant)] > 0
    assert samples[(savings, by_tenant)] == 0  # it wrote the cache, read nothing

    warm = charge(tenant, key, f"warm-{tenant}", TokenCounts(input=100, cache_read=2000, output=50))
    await svc.settle(warm)
    await svc.settle(warm)  # the same request again: one entry, one duplicate, no second charge
    _, samples = scrape(svc.metrics)
    assert samples[(spend, by_tenant)] == pytest.approx(float(await ledger_cost_usd(sessions, tenant)), rel=1e-12)
    assert samples[(savings, by_tenant)] == pytest.approx(float(2000 * SAVED_PER_READ_TOKEN), rel=1e-12)
    assert samples[("kvgate_billing_duplicate_usage_total", frozenset())] == 1

    # Another service (another app) counts apart, and nothing went to the process-wide registry.
    other = service(sessions, pricebook, tmp_path)
    _, fresh = scrape(other.metrics)
    assert (spend, by_tenant) not in fresh and fresh[("kvgate_billing_duplicate_usage_total", frozenset())] == 0
    assert REGISTRY.get_sample_value("kvgate_billing_duplicate_usage_total") is None


async def test_the_tenant_label_can_be_switched_off(sessions, pricebook, tmp_path):
    svc = service(sessions, pricebook, tmp_path, metrics_tenant_label=False)
    tenant, (key,) = await make_tenant(sessions)
    await svc.settle(charge(tenant, key, f"warm-{tenant}", TokenCounts(input=10, cache_read=1000, output=5)))
    text, samples = scrape(svc.metrics)
    assert samples[("kvgate_spend_usd_total", frozenset())] == pytest.approx(
        float(await ledger_cost_usd(sessions, tenant)), rel=1e-12
    )
    assert samples[("kvgate_cache_savings_usd_total", frozenset())] == pytest.approx(
        float(1000 * SAVED_PER_READ_TOKEN), rel=1e-12
    )
    assert "tenant=" not in text and tenant not in text
    labelled = service(sessions, pricebook, tmp_path)  # the default: by tenant
    await labelled.settle(charge(tenant, key, f"again-{tenant}", TokenCounts(input=10, output=5)))
    assert f'tenant="{tenant}"' in scrape(labelled.metrics)[0]


def test_no_created_series_are_rendered() -> None:
    metrics = BillingMetrics()
    metrics.fail_open.inc()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    assert "kvgate_billing_admit_fail_open_created" in generate_latest(registry).decode()  # prometheus_client's own
    text = render_text(registry)[0].decode()
    assert "_created" not in text
    assert "kvgate_billing_admit_fail_open_total 1.0" in text
