"""Anthropic Message Batches through the official SDK: create, retrieve, list, results, cancel, isolation."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.gateway.batches.conftest import message_params, rows, wait_for
from tests.gateway.harness import GatewayServer, Key


def ended(client: anthropic.Anthropic, batch_id: str) -> anthropic.types.messages.MessageBatch:
    return wait_for(lambda: (b := client.messages.batches.retrieve(batch_id)).processing_status == "ended" and b)


def test_a_batch_runs_and_its_results_are_jsonl(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.anthropic(key)
    batch = client.messages.batches.create(
        requests=[
            {"custom_id": "first", "params": message_params(batch_gateway, "Hello")},
            {"custom_id": "second", "params": message_params(batch_gateway, "Bonjour")},
            {"custom_id": "bad-model", "params": {**message_params(batch_gateway), "model": "no-such-model"}},
            {"custom_id": "streamed", "params": message_params(batch_gateway, stream=True)},
        ]
    )
    assert batch.type == "message_batch" and batch.id.startswith("msgbatch_")
    assert batch.processing_status in ("in_progress", "ended")
    assert batch.request_counts.processing + batch.request_counts.succeeded + batch.request_counts.errored == 4
    assert batch.expires_at > batch.created_at

    done = ended(client, batch.id)
    assert done.ended_at is not None and done.results_url and done.results_url.endswith(f"/{batch.id}/results")
    assert done.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 2,
        "errored": 2,
        "canceled": 0,
        "expired": 0,
    }
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {"first", "second", "bad-model", "streamed"}
    first = results["first"]
    assert first.type == "succeeded"
    assert first.message.role == "assistant" and first.message.model == batch_gateway.model
    assert first.message.usage.output_tokens >= 1 and first.message.usage.input_tokens > 0
    assert results["bad-model"].type == "errored"
    assert results["bad-model"].error.error.type == "not_found_error"
    assert results["streamed"].type == "errored" and "stream" in results["streamed"].error.error.message

    # Each item is one usage record, flagged as a batch, under the item's own request id.
    records = rows(batch_gateway, "SELECT * FROM usage_records WHERE request_id LIKE :p", p=f"{batch.id}_%")
    assert len(records) == 2 and all(r["batch"] and r["status"] == "ok" for r in records)
    assert {r["tenant_id"] for r in records} == {key.tenant_id}

    listed = [b.id for b in client.messages.batches.list(limit=10)]
    assert batch.id in listed


def test_list_pages_newest_first(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.anthropic(key)
    ids = [
        client.messages.batches.create(requests=[{"custom_id": "x", "params": message_params(batch_gateway)}]).id
        for _ in range(3)
    ]
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert [b.id for b in page.get_next_page().data] == ids[:1]
    assert [b.id for b in client.messages.batches.list(limit=2)] == ids[::-1]  # auto-paging
    for batch_id in ids:
        ended(client, batch_id)


def test_cancel_ends_the_requests_not_started(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.anthropic(key)
    requests = [{"custom_id": f"r{i}", "params": message_params(batch_gateway, max_tokens=32)} for i in range(12)]
    batch = client.messages.batches.create(requests=requests)
    canceling = client.messages.batches.cancel(batch.id)
    assert canceling.processing_status in ("canceling", "ended") and canceling.cancel_initiated_at is not None
    done = ended(client, batch.id)
    counts = done.request_counts
    assert counts.canceled >= 1 and counts.canceled + counts.succeeded == 12
    results = list(client.messages.batches.results(batch.id))
    assert len(results) == 12
    assert sum(r.result.type == "canceled" for r in results) == counts.canceled
    # The canceled ones never ran: no usage record.
    records = rows(batch_gateway, "SELECT * FROM usage_records WHERE request_id LIKE :p", p=f"{batch.id}_%")
    assert len(records) == counts.succeeded


def test_a_tenant_sees_only_its_own_batches(batch_gateway: GatewayServer, key: Key) -> None:
    owner = batch_gateway.anthropic(key)
    other_key = batch_gateway.new_key()
    other = batch_gateway.anthropic(other_key)
    batch = owner.messages.batches.create(requests=[{"custom_id": "x", "params": message_params(batch_gateway)}])
    ended(owner, batch.id)
    assert owner.messages.batches.retrieve(batch.id).id == batch.id  # positive: the owner sees it
    assert [r.custom_id for r in owner.messages.batches.results(batch.id)] == ["x"]
    for call in (
        lambda: other.messages.batches.retrieve(batch.id),
        lambda: other.messages.batches.cancel(batch.id),
        lambda: other.messages.batches.delete(batch.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            call()
    results = httpx.get(
        f"{batch_gateway.base_url}/v1/messages/batches/{batch.id}/results", headers={"x-api-key": other_key.key}
    )
    assert results.status_code == 404 and results.json()["error"]["type"] == "not_found_error"
    assert batch.id not in [b.id for b in other.messages.batches.list()]
    assert owner.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        owner.messages.batches.retrieve(batch.id)
