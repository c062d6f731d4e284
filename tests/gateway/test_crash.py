"""A real `kvgate serve` killed with SIGKILL mid-generation, then restarted on the same database.

Billing is discovered as in production and the tenant has a monthly budget, so every
admitted request holds a reservation. Streams on both APIs are running when the process
is killed; after the restart each of them must have exactly one usage record (status
`interrupted`, the prompt as input), exactly one ledger entry, and no reservation left,
while the requests that completed before the kill keep their own records and costs.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from kvgate.db import sync_url
from tests.gateway.harness import pg_reachable, postgres_database
from tests.gateway.serve_process import Serve

pytestmark = pytest.mark.timeout(420)

MESSAGES = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper and the sea."}]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def crash_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kvgate.db'}"
        return
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with postgres_database(prefix="kvgate_crash_test") as url:
        yield url


def headers_for(endpoint: str, key: str) -> dict[str, str]:
    if endpoint == "messages":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    return {"authorization": f"Bearer {key}"}


def body_for(endpoint: str, model: str, *, max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": MESSAGES, "temperature": 1.0}
    if stream:
        body["stream"] = True
    return body


PATHS = {"messages": "/v1/messages", "chat.completions": "/v1/chat/completions"}


class HeldStream(threading.Thread):
    """One streaming request, read until the server goes away; `started` is set at the first text."""

    def __init__(self, base_url: str, endpoint: str, key: str, model: str) -> None:
        super().__init__(daemon=True)
        self.base_url, self.endpoint, self.key, self.model = base_url, endpoint, key, model
        self.started = threading.Event()
        self.request_id: str | None = None
        self.completed = False  # the client saw the end of the stream
        self.error: str | None = None

    def run(self) -> None:
        body = body_for(self.endpoint, self.model, max_tokens=3500, stream=True)
        try:
            with (
                httpx.Client(base_url=self.base_url, timeout=120) as client,
                client.stream(
                    "POST", PATHS[self.endpoint], json=body, headers=headers_for(self.endpoint, self.key)
                ) as response,
            ):
                self.request_id = response.headers.get("request-id")
                if response.status_code != 200:
                    self.error = f"{response.status_code} {response.read()!r}"
                    return
                for line in response.iter_lines():
                    if '"text"' in line or '"content"' in line:
                        self.started.set()
                    if "message_stop" in line or line.strip() == "data: [DONE]":
                        self.completed = True
        except httpx.HTTPError as exc:
            self.error = repr(exc)


def complete(server: Serve, endpoint: str, key: str, model: str) -> tuple[str, int, dict[str, Any]]:
    """A short request run to its end: (request id, prompt tokens, usage as the API reported it)."""
    response = httpx.post(
        server.base_url + PATHS[endpoint],
        json=body_for(endpoint, model, max_tokens=8, stream=False),
        headers=headers_for(endpoint, key),
        timeout=120,
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    prompt = usage["input_tokens"] if endpoint == "messages" else usage["prompt_tokens"]
    return response.headers["request-id"], prompt, usage


def db_rows(database_url: str, tenant_id: str) -> dict[str, Any]:
    engine = sa.create_engine(sync_url(database_url))
    try:
        with engine.connect() as conn:
            records = {
                row.request_id: row
                for row in conn.execute(sa.text("SELECT * FROM usage_records WHERE tenant_id = :t"), {"t": tenant_id})
            }
            entries = list(
                conn.execute(
                    sa.text("SELECT * FROM ledger_entries WHERE tenant_id = :t AND kind = 'usage'"), {"t": tenant_id}
                )
            )
            reservations = [
                row.request_id
                for row in conn.execute(
                    sa.text("SELECT request_id FROM budget_reservations WHERE tenant_id = :t"), {"t": tenant_id}
                )
            ]
            counters = {
                row.scope: (int(row.spent_pico), int(row.reserved_pico))
                for row in conn.execute(sa.text("SELECT * FROM budget_counters WHERE owner_id = :t"), {"t": tenant_id})
            }
    finally:
        engine.dispose()
    return {"records": records, "entries": entries, "reservations": reservations, "counters": counters}


def test_sigkill_mid_generation_leaves_one_interrupted_record_per_request(
    crash_db_url: str, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    server = Serve(database_url=crash_db_url, model_dir=tiny_llama_dir, workdir=tmp_path)
    try:
        model = server.admin.get("/healthz").json()["model"]
        tenant = server.admin.post("/admin/v1/tenants", json={"name": "crash"}).json()["id"]
        key = server.admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "k"}).json()["key"]
        budget = server.admin.put(f"/admin/v1/tenants/{tenant}/budget", json={"monthly_limit_usd": "50"})
        assert budget.status_code == 200, budget.text

        # Completed before the kill, one per API: their records must survive as they are.
        done = {endpoint: complete(server, endpoint, key, model) for endpoint in PATHS}
        streams = [HeldStream(server.base_url, endpoint, key, model) for endpoint in [*PATHS, *PATHS]]
        for stream in streams:
            stream.start()
        for stream in streams:
            assert stream.started.wait(120), (stream.error, server.log())
        os.kill(server.process.pid, signal.SIGKILL)
        assert server.stop() == -signal.SIGKILL
    finally:
        if server.process.poll() is None:
            server.process.kill()
    for stream in streams:
        stream.join(30)
    in_flight = [s for s in streams if not s.completed]
    assert len(in_flight) >= 3, [(s.completed, s.error) for s in streams]  # a random model rarely says EOS
    assert all(s.request_id for s in streams)

    # What the kill left: no record, no ledger entry, the reservation held (for an hour, before this change).
    killed = db_rows(crash_db_url, tenant)
    assert not {s.request_id for s in in_flight} & set(killed["records"])
    assert {s.request_id for s in in_flight} <= set(killed["reservations"])

    restarted = Serve(database_url=crash_db_url, model_dir=tiny_llama_dir, workdir=tmp_path)
    try:
        after = db_rows(crash_db_url, tenant)
        prompt = {endpoint: done[endpoint][1] for endpoint in PATHS}
        for stream in in_flight:
            record = after["records"].get(stream.request_id)
            assert record is not None, f"no usage record for {stream.request_id}, in flight at the kill"
            assert record.status == "interrupted", restarted.log()
            writes = record.cache_write_5m_tokens + record.cache_write_1h_tokens + record.cache_write_24h_tokens
            assert record.input_tokens + writes + record.cache_read_tokens == prompt[stream.endpoint]
            assert (record.input_tokens, record.output_tokens, record.ttft_ms) == (prompt[stream.endpoint], 0, None)
            assert record.endpoint == stream.endpoint and record.model == model
        # The positive pair: the completed requests keep their own single records, with what the API reported.
        for endpoint, (request_id, prompt_tokens, usage) in done.items():
            record = after["records"][request_id]
            output = usage["output_tokens"] if endpoint == "messages" else usage["completion_tokens"]
            assert (record.status, record.input_tokens, record.output_tokens) == ("ok", prompt_tokens, output)
        completed_streams = {s.request_id for s in streams if s.completed}
        assert set(after["records"]) == {s.request_id for s in in_flight} | completed_streams | {
            request_id for request_id, _, _ in done.values()
        }
        # Billing: exactly one ledger entry per request, interrupted ones free; nothing left reserved.
        ledger: dict[str, Any] = {}
        for entry in after["entries"]:
            assert entry.request_id not in ledger, "two ledger entries for one request"
            ledger[entry.request_id] = entry
        assert set(ledger) == set(after["records"])
        for stream in in_flight:
            entry = ledger[stream.request_id]
            assert (entry.status, int(entry.cost_pico), entry.input_tokens) == ("interrupted", 0, 0)
        for request_id, _, _ in done.values():
            assert ledger[request_id].status == "ok" and int(ledger[request_id].cost_pico) > 0
        assert after["reservations"] == []
        spent = sum(int(entry.cost_pico) for entry in after["entries"])
        assert after["counters"]["tenant_month"] == (spent, 0)
        # Operators see them counted, by status.
        metrics = restarted.admin.get("/metrics").text
        counted = re.search(r'kvgate:gateway_usage_records_total\{model="[^"]+",status="interrupted"\} (\S+)', metrics)
        assert counted is not None and float(counted.group(1)) == len(in_flight)
        # The journal was compacted, and the restarted server serves.
        assert [p.name for p in (tmp_path / "inflight").glob("seg-*.jnl") if p.stat().st_size] == []
        assert complete(restarted, "messages", key, model)[1] == prompt["messages"]
    finally:
        assert restarted.stop() == 0, restarted.log()


def test_a_journal_that_cannot_write_refuses_requests_in_the_api_shape(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full or failing disk under the journal: 529/503 in each API's shape, the admission undone; then it recovers."""
    import anthropic
    import openai

    from gateway import inflight

    key = gateway.new_key()
    journal = gateway.gateway.journal
    assert journal is not None and journal.path.exists()
    claude, gpt = gateway.anthropic(key), gateway.openai(key)
    ok = claude.messages.create(model=gateway.model, max_tokens=2, messages=MESSAGES)
    assert ok.usage.output_tokens >= 1
    # The end line is queued after the usage record is stored, which may follow the response.
    deadline = time.monotonic() + 30
    while journal.open_requests and time.monotonic() < deadline:
        time.sleep(0.02)
    assert journal.open_requests == 0  # begun and ended

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    released_before = len(gateway.billing.released)
    monkeypatch.setattr(inflight.os, "fdatasync", disk_full)
    with pytest.raises(anthropic.APIStatusError) as refused:
        claude.messages.create(model=gateway.model, max_tokens=2, messages=MESSAGES)
    assert refused.value.status_code == 529 and refused.value.body["error"]["type"] == "overloaded_error"
    assert "durably" in refused.value.body["error"]["message"]
    assert refused.value.response.headers["retry-after"]
    with pytest.raises(openai.APIStatusError) as refused_openai:
        gpt.chat.completions.create(model=gateway.model, max_tokens=2, messages=MESSAGES)
    assert refused_openai.value.status_code == 503
    assert len(gateway.billing.released) == released_before + 2  # each admission was undone
    request_id = refused.value.response.headers["request-id"]
    with gateway.db.connect() as conn:
        stored = conn.execute(sa.text("SELECT 1 FROM usage_records WHERE request_id = :r"), {"r": request_id})
        assert stored.first() is None  # it never ran
    monkeypatch.undo()
    again = claude.messages.create(model=gateway.model, max_tokens=2, messages=MESSAGES)
    assert again.usage.output_tokens >= 1
