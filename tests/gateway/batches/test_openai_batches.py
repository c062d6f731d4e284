"""OpenAI Batch through the official SDK: files.create, batches.create/retrieve/list/cancel, files.content."""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.batches.conftest import chat_line, jsonl, rows, wait_for
from tests.gateway.harness import GatewayServer, Key

ENDED = ("completed", "cancelled", "expired", "failed")


def finished(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in ENDED and b)


def lines(client: openai.OpenAI, file_id: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_and_writes_output_and_error_files(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.openai(key)
    upload = client.files.create(
        file=(
            "requests.jsonl",
            jsonl(
                [
                    chat_line(batch_gateway, "one", "Hello"),
                    chat_line(batch_gateway, "two", "Bonjour", temperature=0),
                    chat_line(batch_gateway, "bad", model="no-such-model"),
                ]
            ),
        ),
        purpose="batch",
    )
    assert upload.object == "file" and upload.purpose == "batch" and upload.bytes > 0
    assert client.files.retrieve(upload.id).filename == "requests.jsonl"
    assert client.files.content(upload.id).text.count("\n") == 3

    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "t"}
    )
    assert batch.object == "batch" and batch.input_file_id == upload.id and batch.metadata == {"job": "t"}
    assert batch.request_counts is not None and batch.request_counts.total == 3

    done = finished(client, batch.id)
    assert done.status == "completed" and done.completed_at is not None
    assert done.request_counts is not None and (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    assert done.output_file_id and done.error_file_id

    output = lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == ["one", "two"]
    first = output[0]
    assert first["error"] is None and first["response"]["status_code"] == 200
    assert first["response"]["request_id"] == f"{batch.id}_0_1"
    body = first["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] > 0
    openai.types.chat.ChatCompletion.model_validate(body)  # the SDK's own type
    errors = lines(client, done.error_file_id)
    assert [line["custom_id"] for line in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 404
    assert errors[0]["response"]["body"]["error"]["code"] == "model_not_found"
    assert client.files.retrieve(done.output_file_id).bytes == len(client.files.content(done.output_file_id).content)

    records = rows(batch_gateway, "SELECT * FROM usage_records WHERE request_id LIKE :p", p=f"{batch.id}_%")
    assert len(records) == 2 and all(r["batch"] and r["endpoint"] == "chat.completions" for r in records)
    assert batch.id in [b.id for b in client.batches.list(limit=100)]


def test_list_pages_with_after(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.openai(key)
    upload = client.files.create(file=("r.jsonl", jsonl([chat_line(batch_gateway, "x")])), purpose="batch")
    ids = [
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h").id
        for _ in range(3)
    ]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert [b.id for b in page.get_next_page().data] == ids[:1]
    for batch_id in ids:
        finished(client, batch_id)


def test_cancel(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.openai(key)
    upload = client.files.create(
        file=("r.jsonl", jsonl([chat_line(batch_gateway, f"r{i}", max_tokens=32) for i in range(12)])), purpose="batch"
    )
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
    done = finished(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts is not None and done.request_counts.failed >= 1
    assert done.error_file_id is not None
    cancelled = [line for line in lines(client, done.error_file_id) if line["error"]]
    assert len(cancelled) == done.request_counts.failed
    assert {line["error"]["code"] for line in cancelled} == {"batch_cancelled"}


def test_a_tenant_sees_only_its_own_batches_and_files(batch_gateway: GatewayServer, key: Key) -> None:
    owner = batch_gateway.openai(key)
    other = batch_gateway.openai(batch_gateway.new_key())
    upload = owner.files.create(file=("r.jsonl", jsonl([chat_line(batch_gateway, "x")])), purpose="batch")
    batch = owner.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = finished(owner, batch.id)
    assert done.output_file_id is not None
    # Positive: the owner reads all of it.
    assert owner.batches.retrieve(batch.id).id == batch.id
    assert owner.files.retrieve(upload.id).id == upload.id
    assert len(lines(owner, done.output_file_id)) == 1
    # Negative: the other tenant gets 404 for each, and lists none of them.
    for call in (
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.files.retrieve(upload.id),
        lambda: other.files.content(upload.id),
        lambda: other.files.content(done.output_file_id),
        lambda: other.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in other.batches.list()]
    assert upload.id not in [f.id for f in other.files.list()]
    assert upload.id in [f.id for f in owner.files.list()]
