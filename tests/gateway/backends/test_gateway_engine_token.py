"""The gateway in front of an engine server that requires KVGATE_ENGINE_TOKEN, end to end (issue 25).

The engine answers 401 to anyone without the token; the gateway, given the same token, serves a
tenant's requests through it (both APIs, streaming too), with the cache behaving as without a token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.backends.factory import engine_client
from gateway.backends.pool import EnginePool
from tests.gateway.harness import GatewayServer
from tests.inference.server.conftest import RunningServer, serve, tiny_settings

TOKEN = "engine-token-for-the-gateway-tests-0123456789"
SYSTEM = "You are the support assistant for a bicycle shop. Answer in one short sentence. " * 12


@pytest.fixture(scope="module")
def guarded_engine(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    with serve(tiny_settings(tiny_llama_dir, num_threads=1, engine_token=TOKEN)) as server:
        yield server


@pytest.fixture(scope="module")
def token_gateway(
    tiny_llama_dir: Path, guarded_engine: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('token-gateway') / 'kvgate.db'}"
    server = GatewayServer(
        model_dir=tiny_llama_dir,
        database_url=url,
        engine_factory=engine_client,
        engine_overrides={"engine_token": TOKEN},  # KVGATE_ENGINE_TOKEN on the gateway: sent to its engines
        engines=guarded_engine.url,
    ).start()
    try:
        yield server
    finally:
        server.stop()


def test_the_engine_refuses_callers_without_the_token(guarded_engine: RunningServer) -> None:
    body = {"prompt": [5, 6, 7], "max_tokens": 2}
    assert httpx.post(f"{guarded_engine.url}/v1/completions", json=body, timeout=60).status_code == 401
    with_token = httpx.post(
        f"{guarded_engine.url}/v1/completions", json=body, headers={"authorization": f"Bearer {TOKEN}"}, timeout=60
    )
    assert with_token.status_code == 200, with_token.text


def test_the_gateway_serves_through_an_engine_that_requires_the_token(
    token_gateway: GatewayServer, guarded_engine: RunningServer
) -> None:
    engine = token_gateway.gateway.engine
    assert isinstance(engine, EnginePool)
    # The pool read the engine's /kv/info (a guarded route) at start: it is routable under its own id.
    assert [m.url for m in engine.members if m.routable] == [guarded_engine.url]
    assert engine.weights == {guarded_engine.engine.core.engine_id: 1.0}

    key = token_gateway.new_key()
    ask = {
        "model": token_gateway.model,
        "max_tokens": 4,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Do you fix brakes?"}],
        "extra_body": {"temperature": 0},
    }
    first = token_gateway.anthropic(key).messages.create(**ask)
    second = token_gateway.anthropic(key).messages.create(**ask)
    assert first.usage.output_tokens >= 1 and first.usage.cache_creation_input_tokens > 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens

    with token_gateway.openai(key).chat.completions.create(
        model=token_gateway.model,
        max_tokens=4,
        messages=[{"role": "user", "content": "Do you fix brakes?"}],
        stream=True,
    ) as stream:
        chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")
