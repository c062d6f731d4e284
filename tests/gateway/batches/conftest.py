"""A gateway with billing's real hooks for the batch tests (SQLite), shared by the module's tests."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.gateway.harness import GatewayServer, Key

BATCH_SETTINGS: dict[str, Any] = {
    "discover_billing": True,
    "engine_overrides": {"max_model_len": 512},
    "min_cacheable_tokens": 16,
}


@pytest.fixture(scope="package")
def batch_gateway(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('batches') / 'kvgate.db'}"
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=url, **BATCH_SETTINGS).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def key(batch_gateway: GatewayServer) -> Key:
    return batch_gateway.new_key()


def message_params(server: GatewayServer, text: str = "Hello", **extra: Any) -> dict[str, Any]:
    return {
        "model": server.model,
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def chat_line(server: GatewayServer, custom_id: str, text: str = "Hello", **body: Any) -> str:
    request = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": server.model, "max_tokens": 4, "messages": [{"role": "user", "content": text}], **body},
    }
    return json.dumps(request)


def jsonl(lines: list[str]) -> io.BytesIO:
    return io.BytesIO(("\n".join(lines) + "\n").encode())


def wait_for(check: Callable[[], Any], *, timeout_s: float = 120.0, what: str = "the batch to end") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def rows(server: GatewayServer, sql: str, **params: Any) -> list[dict[str, Any]]:
    with server.db.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(sql), params).mappings().all()]
