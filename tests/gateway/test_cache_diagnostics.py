"""Cache diagnostics through the official SDKs: Anthropic's `diagnostics`, OpenAI's `prompt_cache_diagnostics`.

Every reason comes from a real two-turn change on the running gateway (tiny model): the second
request names the first's id and the SDK parses what comes back. `model_changed` needs a second
model: a second gateway serving another tiny model shares the database and Redis with the first,
which is also how replicas agree on fingerprints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.gateway.harness import GatewayServer, Key

SYSTEM = "You answer questions about the weather in one short sentence. " * 6
QUESTION = "Will it rain in Lisbon tomorrow?"
REDIS_URL = "redis://127.0.0.1:6379/0"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The forecast for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _redis_up() -> bool:
    from redis.asyncio import Redis

    async def ping() -> bool:
        client = Redis.from_url(REDIS_URL, socket_connect_timeout=0.5)
        try:
            return bool(await client.ping())
        except Exception:
            return False
        finally:
            await client.aclose()

    return asyncio.run(ping())


needs_redis = pytest.mark.skipif(not _redis_up(), reason="Redis is not running on 127.0.0.1:6379")


def message(server: GatewayServer, key: Key | str, *, stream: bool = False, **body: Any) -> Any:
    params: dict[str, Any] = {
        "model": server.model,
        "max_tokens": 2,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    params.update(body)
    client = server.anthropic(key)
    if stream:
        with client.messages.stream(**params) as events:
            return events.get_final_message()
    return client.messages.create(**params)


def reason(reply: Any) -> Any:
    return reply.diagnostics.cache_miss_reason if reply.diagnostics is not None else None


def since(first: Any) -> dict[str, Any]:
    return {"diagnostics": {"previous_message_id": first.id}}


def next_turn(first: Any, question: str = "And the day after?") -> list[dict[str, Any]]:
    reply = first.content[0].text if first.content else "."
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": reply or "."},
        {"role": "user", "content": question},
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_anthropic_reasons_for_each_change(gateway: GatewayServer, stream: bool) -> None:
    key = gateway.new_key()
    first = message(gateway, key, stream=stream, diagnostics={"previous_message_id": None})
    assert first.diagnostics is None  # opted in, nothing to compare with
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.cache_creation_input_tokens

    # A real next turn only appends: nothing diverged, so diagnostics is null, as at Anthropic.
    appended = message(gateway, key, stream=stream, messages=next_turn(first), **since(first))
    assert appended.diagnostics is None

    system = reason(message(gateway, key, stream=stream, system="It is 09:41. " + SYSTEM, **since(first)))
    assert system.type == "system_changed"
    # The system text is where the prompt begins (after the template's first tokens): most of it missed.
    assert 0 < system.cache_missed_input_tokens <= prompt

    tools = reason(message(gateway, key, stream=stream, tools=[WEATHER_TOOL], **since(first)))
    assert tools.type == "tools_changed" and 0 < tools.cache_missed_input_tokens <= prompt

    edited = [{"role": "user", "content": "Will it snow in Oslo tomorrow?"}]
    messages = reason(message(gateway, key, stream=stream, messages=edited, **since(first)))
    assert messages.type == "messages_changed"
    # Only the question differs: the system is shared, so fewer tokens are missed than for a system change.
    assert 0 < messages.cache_missed_input_tokens < system.cache_missed_input_tokens

    salted = reason(message(gateway, key, stream=stream, extra_body={"cache_salt": "blue"}, **since(first)))
    assert salted.type == "unavailable"

    unknown = reason(message(gateway, key, stream=stream, diagnostics={"previous_message_id": "msg_0123abc"}))
    assert unknown.type == "previous_message_not_found"


def test_anthropic_ids_are_scoped_to_the_tenant(gateway: GatewayServer) -> None:
    own, other = gateway.new_key(), gateway.new_key()
    first = message(gateway, own, diagnostics={"previous_message_id": None})
    changed = {"system": "Another system prompt. " + SYSTEM, **since(first)}
    assert reason(message(gateway, own, **changed)).type == "system_changed"
    assert reason(message(gateway, other, **changed)).type == "previous_message_not_found"
    # A key of the same tenant shares its fingerprints.
    sibling = gateway.new_key(own.tenant_id)
    assert reason(message(gateway, sibling, **changed)).type == "system_changed"


def test_anthropic_beta_client_parses_the_same(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.anthropic(key).beta.messages
    params: dict[str, Any] = {
        "model": gateway.model,
        "max_tokens": 2,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
        "betas": ["cache-diagnosis-2026-04-07"],
    }
    first = client.create(**params, diagnostics={"previous_message_id": None})
    second = client.create(**{**params, "tools": [WEATHER_TOOL]}, **since(first))
    assert first.diagnostics is None and second.diagnostics.cache_miss_reason.type == "tools_changed"


@pytest.mark.parametrize(
    ("diagnostics", "param"),
    [
        ({"previous_message_id": "resp_123"}, "diagnostics.previous_message_id"),
        ({"previous_message_id": "msg_has spaces"}, "diagnostics.previous_message_id"),
        ({"previous_message_id": 42}, "diagnostics.previous_message_id"),
        ({"previous_message": "msg_123"}, "diagnostics.previous_message"),
        ("msg_123", "diagnostics"),
    ],
)
def test_anthropic_bad_diagnostics_are_a_400_naming_the_field(
    gateway: GatewayServer, diagnostics: Any, param: str
) -> None:
    key = gateway.new_key()
    with pytest.raises(anthropic.BadRequestError) as refused:
        message(gateway, key, diagnostics=diagnostics)
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error" and param in error["message"]


# --- OpenAI Responses --------------------------------------------------------------------------


def respond(server: GatewayServer, key: Key | str, *, stream: bool = False, **body: Any) -> Any:
    params: dict[str, Any] = {
        "model": server.model,
        "max_output_tokens": 2,
        "temperature": 0,
        "instructions": SYSTEM,
        "input": QUESTION,
    }
    params.update(body)
    client = server.openai(key)
    if not stream:
        return client.responses.create(**params)
    events = list(client.responses.create(stream=True, **params))
    created = next(e for e in events if e.type == "response.created")
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    # The diagnosis is made before generation: the first event already has it, as the last does.
    assert created.response.prompt_cache_diagnostics == last.response.prompt_cache_diagnostics
    return last.response


def against(first: Any) -> dict[str, Any]:
    return {"prompt_cache_options": {"comparison_response_id": first.id}}


FUNCTION_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_openai_diagnostics_for_each_change(gateway: GatewayServer, stream: bool) -> None:
    key = gateway.new_key()
    first = respond(gateway, key, stream=stream)  # any response is a baseline
    assert first.prompt_cache_diagnostics is None and first.prompt_cache_options is None
    prompt = first.usage.input_tokens

    turn = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text or "."},
        {"role": "user", "content": "And the day after?"},
    ]
    hit = respond(gateway, key, stream=stream, input=turn, **against(first))
    assert hit.prompt_cache_diagnostics.type == "cache_hit"
    options = hit.prompt_cache_options
    assert (options.mode, options.ttl, options.comparison_response_id) == ("implicit", "30m", first.id)

    tools = respond(gateway, key, stream=stream, tools=[FUNCTION_TOOL], **against(first)).prompt_cache_diagnostics
    assert tools.type == "cache_miss" and tools.reason == "tools_changed"
    assert tools.cache_missed_tokens + tools.comparison_reusable_tokens == prompt and tools.cache_missed_tokens > 0

    changed = respond(gateway, key, stream=stream, input="Will it snow in Oslo?", **against(first))
    miss = changed.prompt_cache_diagnostics
    assert miss.type == "cache_miss" and miss.reason == "input_changed"
    # The instructions are shared: the reusable prefix holds them.
    assert miss.comparison_reusable_tokens > tools.comparison_reusable_tokens
    instructions = respond(gateway, key, stream=stream, instructions="Be brief. " + SYSTEM, **against(first))
    assert instructions.prompt_cache_diagnostics.reason == "input_changed"

    salted = respond(gateway, key, stream=stream, extra_body={"cache_salt": "blue"}, **against(first))
    assert salted.prompt_cache_diagnostics.type == "unavailable"

    other = gateway.new_key()
    elsewhere = respond(gateway, other, stream=stream, **against(first)).prompt_cache_diagnostics
    assert elsewhere.type == "comparison_response_not_found"
    unknown = respond(gateway, key, stream=stream, prompt_cache_options={"comparison_response_id": "resp_0abc"})
    assert unknown.prompt_cache_diagnostics.type == "comparison_response_not_found"


def test_openai_stored_response_keeps_the_diagnostics(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    first = respond(gateway, key)
    second = respond(
        gateway,
        key,
        tools=[FUNCTION_TOOL],
        prompt_cache_options={"ttl": "12h", **against(first)["prompt_cache_options"]},
    )
    stored = gateway.openai(key).responses.retrieve(second.id)
    assert stored.prompt_cache_diagnostics.reason == "tools_changed"
    assert stored.prompt_cache_options.ttl == "12h"


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"comparison_response_id": "msg_123"}, "prompt_cache_options.comparison_response_id"),
        ({"comparison_response_id": 7}, "prompt_cache_options.comparison_response_id"),
        ({"comparison_id": "resp_123"}, "prompt_cache_options.comparison_id"),
    ],
)
def test_openai_bad_options_are_a_400_naming_the_field(gateway: GatewayServer, options: Any, param: str) -> None:
    key = gateway.new_key()
    with pytest.raises(openai.BadRequestError) as refused:
        respond(gateway, key, prompt_cache_options=options)
    assert refused.value.body["param"] == param


def test_openai_chat_completions_still_refuse_a_comparison(gateway: GatewayServer) -> None:
    # Diagnostics are a Responses feature: Chat Completions' prompt_cache_options has no baseline field.
    key = gateway.new_key()
    body = {
        "model": gateway.model,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": QUESTION}],
        "prompt_cache_options": {"comparison_response_id": "resp_1"},
    }
    answer = httpx.post(
        f"{gateway.base_url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key.key}"}
    )
    assert answer.status_code == 400 and "comparison_response_id" in answer.json()["error"]["param"]
    body["prompt_cache_options"] = {"mode": "implicit"}
    ok = httpx.post(
        f"{gateway.base_url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key.key}"}
    )
    assert ok.status_code == 200


# --- two gateways, two models, one Redis --------------------------------------------------------


@pytest.fixture(scope="module")
def twin_gateways(
    tiny_llama_dir: Path, tiny_qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayServer, GatewayServer]]:
    if not _redis_up():
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    url = f"sqlite:///{tmp_path_factory.mktemp('diagnostics-twins') / 'kvgate.db'}"
    shared = {"redis_url": REDIS_URL, "secret": "a-secret-both-gateways-share", "cache_diagnostics_ttl_s": 120}
    first = GatewayServer(model_dir=tiny_llama_dir, database_url=url, **shared).start()
    try:
        second = GatewayServer(model_dir=tiny_qwen2_dir, database_url=url, **shared).start()
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


@needs_redis
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_model_changed_across_replicas(twin_gateways: tuple[GatewayServer, GatewayServer], stream: bool) -> None:
    llama, qwen = twin_gateways
    assert llama.model != qwen.model
    key = llama.new_key()
    first = message(llama, key, stream=stream, diagnostics={"previous_message_id": None})
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.cache_creation_input_tokens
    # The other replica finds the fingerprint in Redis (else: previous_message_not_found), and on its own
    # model, nothing of the earlier prompt could be read.
    changed = reason(message(qwen, key, stream=stream, model=qwen.model, **since(first)))
    assert changed.type == "model_changed" and changed.cache_missed_input_tokens == prompt

    baseline = respond(llama, key, stream=stream)
    moved = respond(qwen, key, stream=stream, model=qwen.model, **against(baseline)).prompt_cache_diagnostics
    assert moved.type == "cache_miss" and moved.reason == "model_changed"
    assert moved.comparison_reusable_tokens == 0 and moved.cache_missed_tokens == baseline.usage.input_tokens
