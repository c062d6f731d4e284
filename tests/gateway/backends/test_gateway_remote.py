"""The gateway with KVGATE_ENGINES set to engine URLs, through the official SDKs.

Engines are `kvgate engine serve`'s app with the tiny model on real sockets; the gateway loads
only the tokenizer (gateway.backends.factory.engine_client). Its counts equal the embedded
gateway's for the same requests, and usage records say where each request ran.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.backends.factory import engine_client
from gateway.backends.pool import EnginePool
from tests.gateway.backends.conftest import engine_process
from tests.gateway.backends.fake_vllm import fake_vllm
from tests.gateway.harness import GatewayServer
from tests.inference.server.conftest import RunningServer

SYSTEM = "You are the support assistant for a bicycle shop. Answer in one short sentence. " * 12


@pytest.fixture(scope="module")
def remote_gateway(
    tiny_llama_dir: Path, engine_a: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """One engine, so that a tenant's turns land where its prefix is (prefix routing is i16's router's job;
    several engines and the failover between them are tests/gateway/backends/test_pool.py's)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('remote-gateway') / 'kvgate.db'}"
    server = GatewayServer(
        model_dir=tiny_llama_dir,
        database_url=url,
        engine_factory=engine_client,
        engines=f"{engine_a.url}=2",
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _ask(server: GatewayServer, key: Any, *, stream: bool = False) -> Any:
    return server.anthropic(key).messages.with_raw_response.create(
        model=server.model,
        max_tokens=4,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": "Do you fix brakes?"}],
        extra_body={"temperature": 0},
    )


def test_the_gateway_runs_on_the_engines_without_the_weights(
    remote_gateway: GatewayServer, engine_a: RunningServer
) -> None:
    engine = remote_gateway.gateway.engine
    assert isinstance(engine, EnginePool)
    assert engine.model_id == remote_gateway.model == engine_a.engine.model_id
    assert [m.url for m in engine.members if m.routable] == [engine_a.url]
    assert engine.weights == {engine_a.engine.core.engine_id: 2.0}  # engines go by their /kv/info id
    assert httpx.get(f"{remote_gateway.base_url}/healthz").status_code == 200
    assert remote_gateway.admin.get("/metrics").status_code == 200


def test_anthropic_counts_equal_the_embedded_gateways(remote_gateway: GatewayServer, gateway: GatewayServer) -> None:
    remote_key, embedded_key = remote_gateway.new_key(), gateway.new_key()
    results = []
    for server, key in ((remote_gateway, remote_key), (gateway, embedded_key)):
        first, second = _ask(server, key), _ask(server, key)
        results.append([(r.parse().usage.model_dump(exclude={"cost_usd"}), r.parse().content) for r in (first, second)])
        # Another tenant's identical prompt reads nothing.
        stranger = _ask(server, server.new_key()).parse().usage
        assert stranger.cache_read_input_tokens == 0 and stranger.cache_creation_input_tokens > 0
    remote, embedded = results
    assert remote == embedded
    assert remote[1][0]["cache_read_input_tokens"] == remote[0][0]["cache_creation"]["ephemeral_1h_input_tokens"] > 0


def test_usage_records_say_where_the_request_ran(
    remote_gateway: GatewayServer, gateway: GatewayServer, engine_a: RunningServer
) -> None:
    key = remote_gateway.new_key()
    raw = _ask(remote_gateway, key)
    row = remote_gateway.usage_record(raw.headers["request-id"])
    assert row is not None and row["status"] == "ok"
    assert (row["backend"], row["engine_id"]) == ("kvgate", engine_a.engine.core.engine_id)
    assert row["predicted_cached_tokens"] == 0  # the least-loaded router predicts nothing
    embedded = gateway.usage_record(_ask(gateway, gateway.new_key()).headers["request-id"])
    assert embedded is not None and (embedded["backend"], embedded["engine_id"]) == ("embedded", "embedded")
    assert embedded["predicted_cached_tokens"] is None


def test_openai_streaming_through_the_engines(remote_gateway: GatewayServer) -> None:
    client = remote_gateway.openai(remote_gateway.new_key())
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(model=remote_gateway.model, messages=messages, max_tokens=5, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=remote_gateway.model,
            messages=messages,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens > 0  # the second call read the first's blocks


def test_an_engine_dying_mid_stream_ends_the_stream_with_an_error_event(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with engine_process(tiny_llama_dir) as (url, process):
        server = GatewayServer(
            model_dir=tiny_llama_dir,
            database_url=f"sqlite:///{tmp_path / 'kvgate.db'}",
            engine_factory=engine_client,
            engines=url,
        ).start()
        try:
            key = server.new_key()
            body = {
                "model": server.model,
                "max_tokens": 3000,
                "stream": True,
                "messages": [{"role": "user", "content": "Count to a thousand."}],
                "temperature": 0,
            }
            events: list[tuple[str, dict]] = []
            headers = {"x-api-key": key.key, "anthropic-version": "2023-06-01"}
            with httpx.stream("POST", f"{server.base_url}/v1/messages", json=body, headers=headers, timeout=120) as r:
                request_id = r.headers["request-id"]
                name = ""
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        name = line.removeprefix("event:").strip()
                    elif line.startswith("data:"):
                        events.append((name, json.loads(line.removeprefix("data:"))))
                        if name == "content_block_delta" and process.poll() is None:
                            process.send_signal(signal.SIGKILL)
            names = [n for n, _ in events]
            assert "message_start" in names and "content_block_delta" in names
            assert names[-1] == "error" and "message_stop" not in names
            assert events[-1][1]["error"]["type"] == "overloaded_error"
            row = server.usage_record(request_id)
            assert row is not None and row["status"] == "error" and row["backend"] == "kvgate"
            assert 1 <= row["output_tokens"] < 3000
            # With its only engine gone, the next request is refused at once, in the API's shape.
            with pytest.raises(anthropic.APIStatusError) as refused:
                server.anthropic(key).messages.create(
                    model=server.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
                )
            assert refused.value.status_code == 529
            with pytest.raises(openai.APIStatusError) as refused_openai:
                server.openai(key).chat.completions.create(
                    model=server.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
                )
            assert refused_openai.value.status_code == 503
            assert httpx.get(f"{server.base_url}/healthz").status_code == 503
        finally:
            server.stop()


def _streamed(server: GatewayServer, key: Any) -> tuple[dict[str, Any], Any]:
    """One streamed turn with a 1h breakpoint on the system text: message_start's usage, and the SDK's final usage."""
    with server.anthropic(key).messages.stream(
        model=server.model,
        max_tokens=3,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": "Do you fix brakes?"}],
    ) as stream:
        start = next(event for event in stream if event.type == "message_start")
        final = stream.get_final_message()
    return start.message.usage.model_dump(), final.usage


def test_message_start_carries_the_cache_counts_with_a_vllm_engine(
    tiny_llama_dir: Path, served_model: Any, tmp_path: Path
) -> None:
    with fake_vllm(served_model.model_id, block_size=16) as fake:
        server = GatewayServer(
            model_dir=tiny_llama_dir,
            database_url=f"sqlite:///{tmp_path / 'kvgate.db'}",
            engine_factory=engine_client,
            engines=fake.url,
        ).start()
        try:
            key = server.new_key()
            cold_start, cold = _streamed(server, key)
            warm_start, warm = _streamed(server, key)
        finally:
            server.stop()
    # Cold: vLLM reads nothing and the breakpoint's blocks are 1h writes, in message_start already, so the
    # SDK's cache_creation (taken from message_start only) agrees with the final cache_creation_input_tokens.
    assert cold.cache_read_input_tokens == 0 and cold.cache_creation_input_tokens > 0
    assert cold.cache_creation is not None
    assert cold.cache_creation.ephemeral_1h_input_tokens == cold.cache_creation_input_tokens
    assert cold_start["cache_creation_input_tokens"] == cold.cache_creation_input_tokens
    # Warm: vLLM reads every full block it cached before the last prompt token (past the breakpoint too, as
    # it caches them all), predicted at the start; nothing is written.
    prompt = cold.input_tokens + cold.cache_creation_input_tokens
    assert warm.cache_read_input_tokens == (prompt - 1) // 16 * 16 > cold.cache_creation_input_tokens
    assert warm_start["cache_read_input_tokens"] == warm.cache_read_input_tokens
    assert warm.cache_creation_input_tokens == 0 and warm.cache_creation is not None
    assert (warm.cache_creation.ephemeral_5m_input_tokens, warm.cache_creation.ephemeral_1h_input_tokens) == (0, 0)
    assert len(fake.requests) == 2 and fake.requests[0]["cache_salt"] == fake.requests[1]["cache_salt"]
