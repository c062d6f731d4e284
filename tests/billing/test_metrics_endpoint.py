"""GET /metrics of a real kvgate app (tiny model with host and disk KV tiers, billing as `kvgate serve` builds it):

- spend and cache savings equal the ledger's amounts: savings 0 after a cold request, positive after a warm one;
- route labels are full templates, the `/admin/v1` prefix of billing's routes included;
- the metrics listed in docs/gateway.md are exactly the ones served, and no `_created` series;
- a usage record settled twice (the crash came after its settlement, before its journal end) counts as a
  duplicate on the restarted app, and is not charged again;
- a fail-open admission (PostgreSQL cut away behind a proxy) and its spooled settlement are counted.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from billing.models import LedgerEntry
from gateway.inflight import InflightEntry, InflightJournal
from kvgate import REPO_ROOT
from kvgate.db import create_engine, session_factory, utcnow
from tests.billing.tcp_proxy import CuttableProxy
from tests.gateway.harness import GatewayServer, Key
from tests.gateway.test_inflight import crash
from tests.gateway.test_messages_caching import ask, system_block

pytestmark = pytest.mark.timeout(300)

# prices.toml's '*' entry prices the tiny model: $0.10 per Mtok of input, reads at 0.1x ($0.01):
# each token read from the cache saves $0.09 per Mtok.
SAVED_PER_READ_TOKEN = Decimal("0.09") / 10**6
SPEND, SAVINGS = "kvgate_spend_usd_total", "kvgate_cache_savings_usd_total"
DUPLICATES, FAIL_OPEN = "kvgate_billing_duplicate_usage_total", "kvgate_billing_admit_fail_open_total"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Scrape:
    def __init__(self, gw: GatewayServer) -> None:
        response = gw.admin.get("/metrics")
        assert response.status_code == 200, response.text
        self.text = response.text
        families = list(text_string_to_metric_families(self.text))
        self.families = {family.name: family.type for family in families}
        self.samples: Samples = {
            (s.name, frozenset(s.labels.items())): s.value for family in families for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def routes(self) -> set[str]:
        return {dict(labels)["route"] for name, labels in self.samples if name == "kvgate:gateway_requests_total"}


def start_gateway(url: str, tmp: Path, **settings: Any) -> GatewayServer:
    return GatewayServer(
        model_dir=settings.pop("model_dir"),
        database_url=url,
        discover_billing=True,
        engine_overrides={"kv_host_blocks": 16, "kv_disk_dir": tmp / "kv", "kv_disk_blocks": 64},
        **settings,
    ).start()


@pytest.fixture(scope="module")
def server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """An app of its own on SQLite, so that every count is this module's traffic alone."""
    tmp = tmp_path_factory.mktemp("metrics-endpoint")
    gw = start_gateway(f"sqlite:///{tmp / 'kvgate.db'}", tmp, model_dir=tiny_llama_dir)
    try:
        yield gw
    finally:
        gw.stop()


def ledger(gw: GatewayServer, tenant: str) -> tuple[Decimal, Decimal]:
    """The tenant's charged USD and the savings of its cache reads, from its ledger entries."""
    with gw.db.connect() as conn:
        cost, reads = conn.execute(
            select(func.sum(LedgerEntry.cost_pico), func.sum(LedgerEntry.cache_read_tokens)).where(
                LedgerEntry.tenant_id == tenant
            )
        ).one()
    return Decimal(cost).scaleb(-12), reads * SAVED_PER_READ_TOKEN


def test_spend_and_savings_are_the_ledgers_amounts(server: GatewayServer) -> None:
    key = server.new_key()
    tenant = key.tenant_id
    cold = ask(server, key, system=system_block())
    assert cold.usage.cache_creation_input_tokens > 0 and cold.usage.cache_read_input_tokens == 0
    after_cold = Scrape(server)
    spent, saved = ledger(server, tenant)
    assert spent > 0 and saved == 0
    assert after_cold.value(SPEND, tenant=tenant) == pytest.approx(float(spent), rel=1e-12)
    assert after_cold.value(SAVINGS, tenant=tenant) == 0

    warm = ask(server, key, system=system_block())
    assert warm.usage.cache_read_input_tokens > 0
    after_warm = Scrape(server)
    spent, saved = ledger(server, tenant)
    assert saved == warm.usage.cache_read_input_tokens * SAVED_PER_READ_TOKEN > 0
    assert after_warm.value(SPEND, tenant=tenant) == pytest.approx(float(spent), rel=1e-12)
    assert after_warm.value(SAVINGS, tenant=tenant) == pytest.approx(float(saved), rel=1e-12)
    assert after_warm.value(SPEND, tenant=tenant) > after_cold.value(SPEND, tenant=tenant)


def test_route_labels_are_full_templates(server: GatewayServer) -> None:
    key = server.new_key()
    assert server.admin.get(f"/admin/v1/tenants/{key.tenant_id}/budget").status_code == 200  # billing's
    assert server.admin.get("/admin/v1/billing/spool").status_code == 200  # billing's
    ask(server, key)
    server.openai(key).chat.completions.create(
        model=server.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    scrape = Scrape(server)
    requests = "kvgate:gateway_requests_total"
    assert scrape.value(requests, route="/admin/v1/tenants/{tenant_id}/budget", status="200") == 1
    assert scrape.value(requests, route="/admin/v1/billing/spool", status="200") == 1
    assert scrape.value(requests, route="/admin/v1/tenants/{tenant_id}/keys", status="201") >= 1  # the gateway's
    assert scrape.value(requests, route="/v1/messages", status="200") >= 1
    assert scrape.value(requests, route="/v1/chat/completions", status="200") == 1
    labels = scrape.routes()
    assert not {"/tenants/{tenant_id}/budget", "/billing/spool"} & labels  # the prefix is never lost
    templates = {context.path for context in iter_route_contexts(server.app.routes)}
    assert labels <= templates  # every label is one of the app's full templates


DOCUMENTED = re.compile(r"^\| `([^`]+)` \| (counter|gauge|histogram) \|", re.MULTILINE)


def documented_metrics() -> dict[str, str]:
    """The table of docs/gateway.md's "Metrics" section: {family name as parsed from a scrape: type}."""
    text = (REPO_ROOT / "docs" / "gateway.md").read_text()
    section = text[text.index("## Metrics\n") : text.index("\n## ", text.index("## Metrics\n") + 1)]
    rows = DOCUMENTED.findall(section)
    assert len(rows) > 30
    return {name.removesuffix("_total") if kind == "counter" else name: kind for name, kind in rows}


def test_the_documented_metrics_are_exactly_the_served_ones(server: GatewayServer) -> None:
    ask(server, server.new_key())  # the engine has finished a request
    scrape = Scrape(server)
    assert scrape.families == documented_metrics()
    assert "_created" not in scrape.text
    assert "kvgate:gateway_requests_total{" in scrape.text  # counters are there, without their _created twin
    # Nothing of ours in prometheus_client's process-wide registry (which /metrics does not serve).
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith(("kvgate", "vllm"))]


async def test_a_usage_record_settled_again_after_a_crash_is_a_duplicate(
    server: GatewayServer, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    key = await asyncio.to_thread(server.new_key)
    raw = await asyncio.to_thread(
        lambda: server.anthropic(key).messages.with_raw_response.create(
            model=server.model, max_tokens=4, messages=[{"role": "user", "content": "settle me twice"}]
        )
    )
    request_id, message = raw.headers["request-id"], raw.parse()
    assert (await asyncio.to_thread(Scrape, server)).value(DUPLICATES) == 0
    # What a crash between the settlement and the journal's end entry leaves behind.
    journal = InflightJournal.open(tmp_path / "journal")
    await journal.begin(
        InflightEntry(
            request_id=request_id,
            tenant_id=key.tenant_id,
            api_key_id=key.key_id,
            model=server.model,
            endpoint="messages",
            started_at=utcnow(),
            prompt_tokens=message.usage.input_tokens,
        )
    )
    crash(journal)
    restarted = await asyncio.to_thread(
        start_gateway,
        server.database_url,
        tmp_path,
        model_dir=tiny_llama_dir,
        inflight_journal_dir=tmp_path / "journal",
    )
    try:
        scrape = await asyncio.to_thread(Scrape, restarted)
        assert scrape.value(DUPLICATES) == 1
        assert scrape.value(SPEND, tenant=key.tenant_id) is None  # not charged again
        assert (await asyncio.to_thread(Scrape, server)).value(DUPLICATES) == 0  # each app counts its own
        with server.db.connect() as conn:
            entries = conn.execute(select(func.count()).where(LedgerEntry.request_id == request_id)).scalar_one()
        assert entries == 1
    finally:
        await asyncio.to_thread(restarted.stop)


@pytest.mark.postgres
async def test_a_fail_open_admission_and_its_spooled_settlement_are_counted(
    postgres_url: str, tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = make_url(postgres_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
    await proxy.start()
    for name, value in {
        "KVGATE_SPOOL_PATH": str(tmp_path / "spool.jsonl"),
        "KVGATE_SPOOL_REPLAY_INTERVAL_S": "0.2",
        "KVGATE_AUTO_FINALIZE_INVOICES": "false",  # the database is shared with other billing tests
        "KVGATE_DB_CONNECT_TIMEOUT_S": "3",
        "KVGATE_DB_STATEMENT_TIMEOUT_S": "3",
        "KVGATE_DB_POOL_TIMEOUT_S": "3",
    }.items():
        monkeypatch.setenv(name, value)
    proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
    # The proxy runs on this event loop: every blocking call goes to a thread.
    gw = await asyncio.to_thread(start_gateway, proxied, tmp_path, model_dir=tiny_llama_dir, auth_cache_ttl_s=60)
    direct = create_engine(postgres_url)
    try:
        key: Key = await asyncio.to_thread(gw.new_key)

        def message() -> Any:
            return gw.anthropic(key).messages.create(
                model=gw.model, max_tokens=4, messages=[{"role": "user", "content": "hello there"}]
            )

        await asyncio.to_thread(message)  # admitted online: billing knows this tenant's budget
        before = await asyncio.to_thread(Scrape, gw)
        assert (before.value(FAIL_OPEN), before.value("kvgate_billing_spooled_total")) == (0, 0)

        proxy.cut()
        assert (await asyncio.to_thread(message)).usage.output_tokens > 0  # admitted from memory
        proxy.restore()
        deadline = time.monotonic() + 60
        while gw.billing.service.spool.pending() or not gw.gateway.db_health.available:
            assert time.monotonic() < deadline, "the spool was not replayed"
            await asyncio.sleep(0.1)

        after = await asyncio.to_thread(Scrape, gw)
        assert after.value(FAIL_OPEN) == 1
        assert after.value("kvgate_billing_spooled_total") == 1
        assert after.value("kvgate_billing_replayed_total", outcome="applied") == 1
        async with session_factory(direct)() as session:
            cost = await session.scalar(
                select(func.sum(LedgerEntry.cost_pico)).where(LedgerEntry.tenant_id == key.tenant_id)
            )
        # Both requests' spend: the live one, and the spooled one once its replay wrote the ledger.
        assert after.value(SPEND, tenant=key.tenant_id) == pytest.approx(float(Decimal(cost).scaleb(-12)), rel=1e-12)
        assert after.value(SPEND, tenant=key.tenant_id) > before.value(SPEND, tenant=key.tenant_id)
    finally:
        proxy.restore()
        await asyncio.to_thread(gw.stop)
        await direct.dispose()
        await proxy.stop()
