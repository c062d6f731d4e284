"""OpenAI Chat Completions through the official openai SDK: automatic caching and usage."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.gateway.harness import GatewayServer

SYSTEM = "You are the assistant of a small bakery. Keep answers to a single sentence, please. " * 12


def chat(server: GatewayServer, key: Any, **body: Any) -> Any:
    params: dict[str, Any] = {
        "model": server.model,
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Any rye bread today?"}],
    }
    params.update(body)
    return server.openai(key).chat.completions.create(**params)


def test_automatic_caching_writes_then_reads(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    first = chat(gateway, key)
    details = first.usage.prompt_tokens_details
    assert details.cached_tokens == 0
    written = details.cache_write_tokens
    assert written > 0
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert first.usage.completion_tokens == 4 and first.choices[0].finish_reason == "length"

    second = chat(gateway, key)
    assert second.usage.prompt_tokens_details.cached_tokens == written
    assert second.usage.prompt_tokens_details.cache_write_tokens == 0
    assert second.usage.prompt_tokens == first.usage.prompt_tokens  # prompt_tokens includes cached ones

    # Another tenant: nothing shared. The same tenant, another key: shared.
    assert chat(gateway, gateway.new_key()).usage.prompt_tokens_details.cached_tokens == 0
    assert chat(gateway, gateway.new_key(key.tenant_id)).usage.prompt_tokens_details.cached_tokens == written


def test_short_prompts_are_not_cached_and_cached_tokens_is_always_present(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    for _ in range(2):
        usage = chat(gateway, key, messages=[{"role": "user", "content": "Hi"}]).usage
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert usage.prompt_tokens_details.cache_write_tokens == 0


def test_prompt_cache_retention_and_key(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    written = chat(gateway, key, prompt_cache_retention="in_memory").usage.prompt_tokens_details.cache_write_tokens
    assert written > 0
    # The older spelling is accepted; prompt_cache_key routes but does not change the salt.
    again = chat(gateway, key, prompt_cache_key="user-42", extra_body={"prompt_cache_retention": "in-memory"})
    assert again.usage.prompt_tokens_details.cached_tokens == written
    with pytest.raises(openai.BadRequestError) as refused:
        chat(gateway, key, prompt_cache_retention="24h")
    assert refused.value.body["param"] == "prompt_cache_retention"
    assert "24h" in refused.value.body["message"]


def test_text_parts_stop_and_max_completion_tokens(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    completion = chat(
        gateway,
        key,
        max_tokens=None,
        max_completion_tokens=3,
        stop=["\n\n"],
        seed=7,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}],
    )
    assert completion.usage.completion_tokens <= 3
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.choices[0].message.role == "assistant"


def test_models_list_and_retrieve(gateway: GatewayServer) -> None:
    client = gateway.openai(gateway.new_key())
    assert [m.id for m in client.models.list()] == [gateway.model]
    assert client.models.retrieve(gateway.model).id == gateway.model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    # The anthropic SDK's models.list gets Anthropic's shape from the same route.
    listed = gateway.anthropic(gateway.new_key()).models.list()
    assert [m.id for m in listed.data] == [gateway.model]


def test_vanishing_temperature_and_top_p_are_greedy_not_a_crash(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    greedy = chat(gateway, key, temperature=0, messages=[{"role": "user", "content": "Count to three."}])
    for extreme in ({"temperature": 1e-300}, {"top_p": 1e-300, "temperature": 1.5}, {"top_p": 0}):
        body = {"temperature": 1.0, **extreme, "messages": [{"role": "user", "content": "Count to three."}]}
        completion = chat(gateway, key, **body)
        assert completion.choices[0].finish_reason == "length"
        if "top_p" not in extreme:
            assert completion.choices[0].message.content == greedy.choices[0].message.content
    message = gateway.anthropic(key).messages.create(
        model=gateway.model, max_tokens=2, messages=[{"role": "user", "content": "Hi"}], extra_body={"top_p": 1e-300}
    )
    assert message.stop_reason == "max_tokens"
