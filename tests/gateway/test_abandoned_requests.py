"""A client that abandons a non-streaming request stops its generation and is billed for what was computed.

The request goes over a raw socket, which the test closes while the engine is
generating; the usage record must then say `cancelled`, with far fewer output
tokens than asked for, soon after.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
import sqlalchemy as sa

from tests.gateway.harness import GatewayServer

PROMPT = "Tell me everything you know about trains, timetables and tickets, in great detail."
MAX_TOKENS = 3000


def request_bytes(server: GatewayServer, api: str, key: str, max_tokens: int) -> bytes:
    if api == "anthropic":
        path, auth = "/v1/messages", f"x-api-key: {key}"
    else:
        path, auth = "/v1/chat/completions", f"authorization: Bearer {key}"
    body = json.dumps(
        {
            "model": server.model,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}],
        }
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{auth}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def tenant_records(server: GatewayServer, tenant_id: str) -> list[dict[str, Any]]:
    with server.db.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM usage_records WHERE tenant_id = :t"), {"t": tenant_id}).mappings()
        return [dict(row) for row in rows]


def wait_for_record(server: GatewayServer, tenant_id: str, timeout_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = tenant_records(server, tenant_id)
        if records:
            assert len(records) == 1, records
            return records[0]
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_closing_the_connection_cancels_a_non_streaming_request(gateway: GatewayServer, api: str) -> None:
    engine = gateway.gateway.engine.engine.core
    # A completed request is recorded `ok` with every token asked for.
    done = gateway.new_key()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=60) as sock:
        sock.sendall(request_bytes(gateway, api, done.key, 8))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    record = wait_for_record(gateway, done.tenant_id, timeout_s=10)
    assert record is not None and record["status"] == "ok" and 1 <= record["output_tokens"] <= 8

    gone = gateway.new_key()
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=60)
    sock.sendall(request_bytes(gateway, api, gone.key, MAX_TOKENS))
    deadline = time.monotonic() + 30
    while not engine.has_unfinished():  # generating now
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.01)
    time.sleep(0.3)
    sock.close()
    closed_at = time.monotonic()
    record = wait_for_record(gateway, gone.tenant_id, timeout_s=20)
    assert record is not None, "no usage record for the abandoned request"
    assert time.monotonic() - closed_at < 10
    assert record["status"] == "cancelled", record
    assert record["output_tokens"] < MAX_TOKENS // 2, record
    assert record["input_tokens"] + record["cache_write_5m_tokens"] + record["cache_read_tokens"] > 0
    deadline = time.monotonic() + 10
    while engine.has_unfinished():  # nothing of it is left running
        assert time.monotonic() < deadline, "the engine kept generating"
        time.sleep(0.01)
