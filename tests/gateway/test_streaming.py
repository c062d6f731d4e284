"""Streaming on both APIs: the exact event sequences, usage equal to non-streaming, and abandoned streams."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.gateway.harness import GatewayServer

SYSTEM = "You answer questions about trains, timetables and tickets, briefly and politely. " * 12
MESSAGES = [{"role": "user", "content": "When is the next train to the coast?"}]


def anthropic_body(server: GatewayServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": server.model,
        "max_tokens": 6,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": MESSAGES,
        "temperature": 0,
        **extra,
    }


def sse_events(response: httpx.Response) -> list[tuple[str | None, str]]:
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, line.removeprefix("data: ")))
            name = None
    return events


def test_anthropic_event_sequence(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/v1/messages",
        json=anthropic_body(gateway, stream=True),
        headers={"x-api-key": key.key, "anthropic-version": "2023-06-01"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["request-id"].startswith("req_")
        events = sse_events(response)
    names = [name for name, _ in events]
    # A ping as soon as the request is admitted (and every few seconds until the first token).
    pings = next(i for i, name in enumerate(names) if name != "ping")
    assert pings >= 1
    names = names[pings:]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    for name, data in events:
        assert json.loads(data)["type"] == name
    start = json.loads(events[pings][1])["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["stop_reason"] is None
    delta = json.loads(events[-2][1])
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 6
    assert delta["usage"]["cache_creation_input_tokens"] > 0


def _same_usage_with_two_tenants(run: Any, gateway: GatewayServer) -> list[tuple[Any, Any]]:
    # Two fresh tenants see the same cache states (cold, then warm), one streaming and one not.
    plain, streamed = gateway.new_key(), gateway.new_key()
    return [(run(plain, False), run(streamed, True)) for _ in range(2)]


def test_anthropic_streamed_usage_equals_non_streamed(gateway: GatewayServer) -> None:
    def run(key: Any, stream: bool) -> Any:
        client = gateway.anthropic(key)
        body = anthropic_body(gateway)
        body.pop("temperature")
        if not stream:
            return client.messages.create(**body, extra_body={"temperature": 0})
        with client.messages.stream(**body, extra_body={"temperature": 0}) as events:
            text = "".join(events.text_stream)
            message = events.get_final_message()
        assert text == message.content[0].text
        return message

    (cold_plain, cold_stream), (warm_plain, warm_stream) = _same_usage_with_two_tenants(run, gateway)
    assert cold_plain.usage.cache_creation_input_tokens > 0 and warm_plain.usage.cache_read_input_tokens > 0
    for plain, streamed in ((cold_plain, cold_stream), (warm_plain, warm_stream)):
        assert streamed.content[0].text == plain.content[0].text
        assert streamed.stop_reason == plain.stop_reason
        for field in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            assert getattr(streamed.usage, field) == getattr(plain.usage, field), field
        assert streamed.usage.cache_creation == plain.usage.cache_creation


def test_openai_streamed_usage_equals_non_streamed(gateway: GatewayServer) -> None:
    def run(key: Any, stream: bool) -> Any:
        client = gateway.openai(key)
        body = {
            "model": gateway.model,
            "max_tokens": 6,
            "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, *MESSAGES],
        }
        if not stream:
            completion = client.chat.completions.create(**body)
            return completion.choices[0].message.content, completion.usage
        chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
        assert all(c.usage is None for c in chunks[:-1])
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-2].choices[0].finish_reason == "length"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].usage

    for (plain_text, plain), (streamed_text, streamed) in _same_usage_with_two_tenants(run, gateway):
        assert streamed_text == plain_text
        assert streamed.model_dump() == plain.model_dump()


def test_openai_stream_without_usage_ends_with_done(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    body = {"model": gateway.model, "max_tokens": 3, "messages": MESSAGES, "stream": True}
    with httpx.stream(
        "POST", f"{gateway.base_url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key.key}"}
    ) as response:
        events = sse_events(response)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all("usage" not in chunk for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_an_abandoned_stream_is_cancelled_and_recorded_once(gateway: GatewayServer, api: str) -> None:
    key = gateway.new_key()
    if api == "anthropic":
        url, headers = "/v1/messages", {"x-api-key": key.key}
        body = anthropic_body(gateway, max_tokens=3000, stream=True)
    else:
        url, headers = "/v1/chat/completions", {"authorization": f"Bearer {key.key}"}
        body = {"model": gateway.model, "max_tokens": 3000, "messages": MESSAGES, "stream": True}
    with (
        httpx.Client(base_url=gateway.base_url, timeout=60) as client,
        client.stream("POST", url, json=body, headers=headers) as response,
    ):
        request_id = response.headers["request-id"]
        lines = response.iter_lines()
        received = 0
        for line in lines:
            received += line.startswith("data: ")
            if received >= 6:
                break
    # The client has gone; the engine stops and exactly one record says what was generated.
    started = time.monotonic()
    row = gateway.usage_record(request_id, wait_s=30)
    assert row is not None, "no usage record for an abandoned stream"
    assert row["status"] == "cancelled"
    assert 1 <= row["output_tokens"] < 3000
    assert time.monotonic() - started < 30
    assert gateway.count_usage_records(request_id) == 1
    # Nothing of the request is left running.
    assert not gateway.gateway.engine.engine.core.has_unfinished()
