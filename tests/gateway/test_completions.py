"""OpenAI legacy Completions (/v1/completions) through the official openai SDK: raw prompts, caching, streams."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway.harness import GatewayServer

PROMPT = "Once upon a time, in a small bakery at the corner of the market square, there lived a baker who " * 6


def complete(server: GatewayServer, key: Any, **body: Any) -> Any:
    params: dict[str, Any] = {"model": server.model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    params.update(body)
    return server.openai(key).completions.create(**params)


def test_raw_prompt_is_cached_and_counted(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    first = complete(gateway, key)
    assert first.object == "text_completion" and first.id.startswith("cmpl-")
    assert first.choices[0].finish_reason == "length" and first.choices[0].index == 0
    usage = first.usage
    assert usage.completion_tokens == 4 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0
    written = usage.prompt_tokens_details.cache_write_tokens
    assert written > 0

    second = complete(gateway, key)
    assert second.usage.prompt_tokens_details.cached_tokens == written
    assert second.choices[0].text == first.choices[0].text  # same output with a cache hit
    assert complete(gateway, gateway.new_key()).usage.prompt_tokens_details.cached_tokens == 0

    record = gateway.usage_record("req_" + first.id.removeprefix("cmpl-"))
    assert record is not None and record["endpoint"] == "completions"


def test_no_chat_template_and_default_max_tokens(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    raw = complete(gateway, key, prompt="Hello", max_tokens=None)
    assert raw.usage.completion_tokens == 16  # OpenAI's default on this endpoint
    chat = gateway.openai(key).chat.completions.create(
        model=gateway.model, max_tokens=1, messages=[{"role": "user", "content": "Hello"}]
    )
    # "Hello" alone is a token or two; the chat template wraps it in many more.
    assert raw.usage.prompt_tokens <= 3 < chat.usage.prompt_tokens
    # A list of one string, and token ids, are the same prompt.
    assert complete(gateway, key, prompt=["Hello"]).usage.prompt_tokens == raw.usage.prompt_tokens
    ids = gateway.gateway.engine.tokenizer("Hello")["input_ids"]
    by_ids = complete(gateway, key, prompt=ids, max_tokens=16)
    assert by_ids.usage.prompt_tokens == raw.usage.prompt_tokens and by_ids.choices[0].text == raw.choices[0].text


def test_stream_with_usage(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.openai(key)
    params = {"model": gateway.model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **params))
    assert all(c.object == "text_completion" for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all(c.usage is None for c in chunks[:-1])
    final = chunks[-1]
    assert final.choices == [] and final.usage.completion_tokens == 5
    plain = client.completions.create(**params)
    assert plain.choices[0].text == text and plain.usage.prompt_tokens == final.usage.prompt_tokens
    # Without include_usage, no usage chunk.
    assert all(c.usage is None and c.choices for c in client.completions.create(stream=True, **params))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": [10**9]}, None),
        ({"prompt": ""}, None),
        ({"model": "nope"}, "model"),
        ({"messages": []}, "messages"),
    ],
)
def test_bad_requests_are_400s_in_openais_shape(gateway: GatewayServer, body: dict[str, Any], param: Any) -> None:
    key = gateway.new_key()
    payload = {"model": gateway.model, "prompt": "hi", "max_tokens": 2, **body}
    response = httpx.post(
        f"{gateway.base_url}/v1/completions", json=payload, headers={"authorization": f"Bearer {key.key}"}, timeout=60
    )
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]
