"""Batches are durable: a gateway stopped mid-batch leaves it in the database, and the next one started on
the same database finishes it, running no item twice and billing none twice (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from kvgate.db import sync_url
from tests.gateway.batches.conftest import BATCH_SETTINGS, message_params, wait_for
from tests.gateway.harness import GatewayServer, pg_reachable, postgres_database

ITEMS = 8


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def restart_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kvgate.db'}"
        return
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with postgres_database("kvgate_batch_restart") as url:
        yield url


def _rows(db: sa.Engine, sql: str, **params: object) -> list[dict[str, object]]:
    with db.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(sql), params).mappings().all()]


def _lose_a_result(db: sa.Engine, batch_id: str, tenant_id: str, key_id: str, model: str) -> int | None:
    """Make a waiting item look like a crash after its usage was recorded and before its result was stored:
    running, its lease run out, its attempt's usage record there. Returns its position."""
    (item,) = _rows(
        db,
        "SELECT * FROM batch_items WHERE batch_id = :b AND status = 'pending' ORDER BY position DESC LIMIT 1",
        b=batch_id,
    ) or [None]
    if item is None:
        return None
    request_id = f"{batch_id}_{item['position']}_1"
    past = datetime.now(UTC) - timedelta(minutes=1)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE batch_items SET status = 'running', attempt = 1, request_id = :r, lease_until = :t "
                "WHERE batch_id = :b AND position = :p"
            ),
            {"r": request_id, "t": past, "b": batch_id, "p": item["position"]},
        )
        conn.execute(
            sa.text(
                "INSERT INTO usage_records (request_id, tenant_id, api_key_id, model, endpoint, started_at, "
                "input_tokens, cache_write_5m_tokens, cache_write_1h_tokens, cache_write_30m_tokens, "
                "cache_write_12h_tokens, cache_write_24h_tokens, cache_read_tokens, output_tokens, latency_ms, "
                "status, batch) VALUES (:r, :t, :k, :m, 'messages', :s, 5, 0, 0, 0, 0, 0, 0, 3, 1, 'ok', :yes)"
            ),
            {"r": request_id, "t": tenant_id, "k": key_id, "m": model, "s": past, "yes": True},
        )
    return int(item["position"])


def _probe_hostile_ids(server: GatewayServer, key: str) -> None:
    """Ids and names the database could choke on (long, non-ASCII, NUL in a file name): 404s and a 200."""
    headers = {"x-api-key": key, "authorization": f"Bearer {key}"}
    for path in ("/v1/messages/batches/", "/v1/batches/", "/v1/files/"):
        for weird in ("x" * 500, "\u00fc\u6f22", "msgbatch_'; DROP TABLE batches; --"):
            response = httpx.get(f"{server.base_url}{path}{weird}", headers=headers)
            assert response.status_code == 404, (path, weird, response.text)
    upload = httpx.post(
        f"{server.base_url}/v1/files",
        files={"file": ("a\x00b\u00fc.jsonl", b"{}")},
        data={"purpose": "batch"},
        headers=headers,
    )
    assert upload.status_code == 200, upload.text
    assert "\x00" not in upload.json()["filename"] and upload.json()["filename"].endswith("b\u00fc.jsonl")


def test_a_restart_resumes_the_batch(tiny_llama_dir: Path, restart_url: str) -> None:
    first = GatewayServer(model_dir=tiny_llama_dir, database_url=restart_url, batch_concurrency=1, **BATCH_SETTINGS)
    first.start()
    key = first.new_key()
    client = first.anthropic(key)
    requests = [
        {"custom_id": f"r{i}", "params": message_params(first, f"Item {i}", max_tokens=48)} for i in range(ITEMS)
    ]
    batch = client.messages.batches.create(requests=requests)
    wait_for(lambda: client.messages.batches.retrieve(batch.id).request_counts.succeeded >= 2, what="two items")
    first.stop()  # mid-batch: the item in flight is stopped (recorded interrupted, free) and handed back

    db = sa.create_engine(sync_url(restart_url))
    try:
        done_before = {
            r["position"]
            for r in _rows(
                db, "SELECT position FROM batch_items WHERE batch_id = :b AND status = 'succeeded'", b=batch.id
            )
        }
        assert 2 <= len(done_before) < ITEMS
        assert not _rows(db, "SELECT * FROM batch_items WHERE batch_id = :b AND status = 'running'", b=batch.id)
        lost = _lose_a_result(db, batch.id, key.tenant_id, key.key_id, first.model)

        second = GatewayServer(model_dir=tiny_llama_dir, database_url=restart_url, **BATCH_SETTINGS).start()
        try:
            client = second.anthropic(key)
            wait_for(lambda: client.messages.batches.retrieve(batch.id).processing_status == "ended")
            results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
            _probe_hostile_ids(second, key.key)
        finally:
            second.stop()
        assert sorted(results) == sorted(f"r{i}" for i in range(ITEMS))
        if lost is not None:  # never run again: errored, and its one usage record is the one already there
            assert results[f"r{lost}"].type == "errored"
            assert "lost" in results[f"r{lost}"].error.error.message  # type: ignore[union-attr]
        succeeded = {k for k, r in results.items() if r.type == "succeeded"}
        assert len(succeeded) == ITEMS - (lost is not None)

        records = _rows(db, "SELECT * FROM usage_records WHERE request_id LIKE :p", p=f"{batch.id}_%")
        billed = [r for r in records if r["status"] != "interrupted"]
        # One billed record per item, under one of its attempts' request ids; stopped attempts are free.
        by_item: dict[str, int] = {}
        for record in billed:
            item_key = str(record["request_id"]).rsplit("_", 1)[0]
            by_item[item_key] = by_item.get(item_key, 0) + 1
        assert set(by_item.values()) == {1} and len(by_item) == ITEMS
        entries = _rows(
            db, "SELECT * FROM ledger_entries WHERE request_id LIKE :p AND kind = 'usage'", p=f"{batch.id}_%"
        )
        charged = [e for e in entries if e["cost_pico"] > 0]
        assert len(charged) == ITEMS - (lost is not None)  # the fabricated record was never settled
        assert all(e["batch"] for e in entries)
        for record in records:
            if record["status"] == "interrupted":
                assert all(e["cost_pico"] == 0 for e in entries if e["request_id"] == record["request_id"])
    finally:
        db.dispose()
