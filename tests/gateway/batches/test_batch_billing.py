"""The batch price: cache reads inside a batch are reads, and the ledger charges half the interactive price."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.catalog import to_version
from billing.invoice_lines import UsageAggregate, compute_invoice
from billing.models import PriceVersionRow
from billing.prices import PriceError, PriceSpec, PriceVersion
from kvgate.usage import TokenCounts
from tests.gateway.batches.conftest import rows, wait_for
from tests.gateway.harness import GatewayServer, Key

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 8


def _params(server: GatewayServer) -> dict[str, object]:
    return {
        "model": server.model,
        "max_tokens": 4,
        "temperature": 0,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "What is a batch?"}],
    }


def _entry(server: GatewayServer, request_id: str) -> dict[str, object]:
    found = wait_for(
        lambda: rows(server, "SELECT * FROM ledger_entries WHERE request_id = :r AND kind = 'usage'", r=request_id),
        what=f"the ledger entry of {request_id}",
    )
    return found[0]


def _version(server: GatewayServer, version_id: int) -> PriceVersion:
    with Session(server.db) as session:
        row = session.scalars(select(PriceVersionRow).where(PriceVersionRow.id == version_id)).one()
        return to_version(row)


def test_a_batch_item_reads_the_cache_and_pays_half(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.anthropic(key)
    interactive_params = {k: v for k, v in _params(batch_gateway).items() if k != "temperature"}
    first = client.messages.with_raw_response.create(**interactive_params, extra_body={"temperature": 0})  # writes
    assert first.parse().usage.cache_creation_input_tokens > 0
    second = client.messages.with_raw_response.create(**interactive_params, extra_body={"temperature": 0})  # reads
    interactive = second.parse().usage
    assert interactive.cache_read_input_tokens > 0

    batch = client.messages.batches.create(requests=[{"custom_id": "same", "params": _params(batch_gateway)}])
    wait_for(lambda: client.messages.batches.retrieve(batch.id).processing_status == "ended")
    (result,) = list(client.messages.batches.results(batch.id))
    assert result.result.type == "succeeded"
    usage = result.result.message.usage
    assert usage.cache_read_input_tokens == interactive.cache_read_input_tokens > 0  # a read, as interactively
    assert usage.cache_creation_input_tokens == 0 and usage.input_tokens == interactive.input_tokens

    batch_entry = _entry(batch_gateway, f"{batch.id}_0_1")
    interactive_entry = _entry(batch_gateway, second.headers["request-id"])
    assert batch_entry["batch"] and not interactive_entry["batch"]
    counts = TokenCounts.from_columns(batch_entry)
    assert counts == TokenCounts.from_columns(interactive_entry)  # the same usage...
    assert counts.cache_read > 0 and counts.cache_writes == 0
    version = _version(batch_gateway, int(batch_entry["price_version_id"]))
    assert version.batch_multiplier == Decimal("0.5")
    # ...at exactly half the interactive price, reads priced at batch x read, in integer pico-dollars.
    assert batch_entry["cost_pico"] * 2 == interactive_entry["cost_pico"]
    assert batch_entry["cost_pico"] == version.cost_pico(counts, batch=True)
    assert version.batch_rates.cache_read * 2 == version.rates.cache_read
    expected = sum(n * version.batch_rates.for_category(c) for c, n in counts.by_category().items() if n)
    assert batch_entry["cost_pico"] == expected
    # One ledger entry per request: the usage record and the ledger agree.
    (record,) = rows(batch_gateway, "SELECT * FROM usage_records WHERE request_id = :r", r=f"{batch.id}_0_1")
    assert record["batch"] and TokenCounts.from_columns(record) == counts


def _spec(**fields: object) -> PriceSpec:
    return PriceSpec(**_fields(**fields))  # type: ignore[arg-type]


def _fields(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "model": "m",
        "effective_from": datetime(2026, 1, 1, tzinfo=UTC),
        "input_usd_per_mtok": Decimal("3"),
        "output_usd_per_mtok": Decimal("15"),
    }
    return {**base, **fields}


def test_batch_rates_are_exact_and_per_version() -> None:
    spec = _spec()
    assert spec.batch_rates.input * 2 == spec.rates.input
    assert spec.batch_rates.cache_write_1h * 2 == spec.rates.cache_write_1h
    counts = TokenCounts(input=7, cache_write_5m=32, cache_read=64, output=5)
    assert spec.cost_pico(counts, batch=True) * 2 == spec.cost_pico(counts)
    assert _spec(batch_multiplier=Decimal("0.25")).cost_pico(counts, batch=True) * 4 == spec.cost_pico(counts)
    with pytest.raises(PriceError, match="batch_multiplier"):
        _spec(batch_multiplier=Decimal("0"))
    # A batch rate finer than a pico-dollar per token is rounded half-even (100 x 0.05 = 5 exactly;
    # 100 x 1.25 x 0.05 = 6.25 -> 6): the interactive price stays valid (tests/billing/test_cost.py).
    fine = _spec(input_usd_per_mtok=Decimal("0.0001"), batch_multiplier=Decimal("0.05")).rates_for(batch=True)
    assert fine.input == 5 and fine.cache_write_5m == 6


def test_invoices_price_batch_lines_at_the_batch_rates() -> None:
    version = PriceVersion(id=1, **_fields())  # type: ignore[arg-type]
    counts = TokenCounts(input=1000, cache_read=2000, output=100)
    invoice = compute_invoice(
        aggregates=[
            UsageAggregate(model="m", price_version_id=1, counts=counts, requests=1),
            UsageAggregate(model="m", price_version_id=1, counts=counts, requests=1, batch=True),
        ],
        versions={1: version},
    )
    interactive = [line for line in invoice.lines if not line.batch]
    batch = [line for line in invoice.lines if line.batch]
    assert [line.exact_amount_pico * 2 for line in batch] == [line.exact_amount_pico for line in interactive]
    assert batch[0].description == "m — Input (batch)"
    assert batch[0].unit_price_usd_per_mtok * 2 == interactive[0].unit_price_usd_per_mtok


def test_an_anthropic_error_is_not_billed(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.anthropic(key)
    params = {**_params(batch_gateway), "max_tokens": 0}
    batch = client.messages.batches.create(requests=[{"custom_id": "zero", "params": params}])
    wait_for(lambda: client.messages.batches.retrieve(batch.id).processing_status == "ended")
    (result,) = list(client.messages.batches.results(batch.id))
    assert result.result.type == "errored" and result.result.error.error.type == "invalid_request_error"
    assert rows(batch_gateway, "SELECT * FROM ledger_entries WHERE request_id LIKE :p", p=f"{batch.id}_%") == []
