"""Big prompts cannot freeze the gateway for other tenants, and hopeless ones are refused before tokenizing.

The tiny test model has a 4,096-token context and SmolLM2's tokenizer (longest
token: 81 characters), so no prompt of more than 81 x 4,095 characters fits, and
no body larger than 12 bytes a character of that plus 1 MiB can hold one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.gateway.harness import GatewayServer

CONTEXT = 4096
LONGEST_TOKEN_CHARS = 81
MAX_CHARS = LONGEST_TOKEN_CHARS * (CONTEXT - 1)
MAX_BODY_BYTES = 12 * MAX_CHARS + 1024 * 1024  # 12 JSON bytes a character, 1 MiB for the rest


def body(server: GatewayServer, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": server.model, "messages": [{"role": "user", "content": text}], **extra}


def test_the_bounds_are_derived_from_the_tokenizer_and_the_context(gateway: GatewayServer) -> None:
    bounds = gateway.gateway.prep.renderer.bounds
    assert gateway.gateway.engine.max_model_len == CONTEXT
    assert bounds.chars_per_token == LONGEST_TOKEN_CHARS and bounds.max_chars == MAX_CHARS
    assert bounds.max_body_bytes == MAX_BODY_BYTES


def test_a_prompt_just_inside_the_context_is_accepted_and_one_token_more_is_not(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.anthropic(key)

    def count(words: int) -> int:
        return client.messages.count_tokens(**body(gateway, "hi" + " hello" * words)).input_tokens

    base = count(0)
    words = CONTEXT - 1 - base
    assert count(words) == CONTEXT - 1  # one token per word: the calibration holds
    fits = client.messages.create(**body(gateway, "hi" + " hello" * words, max_tokens=1))
    assert fits.usage.input_tokens + fits.usage.cache_creation_input_tokens == CONTEXT - 1
    assert fits.usage.output_tokens == 1
    with pytest.raises(anthropic.BadRequestError, match=f"prompt is too long: {CONTEXT} tokens > {CONTEXT - 1}"):
        client.messages.create(**body(gateway, "hi" + " hello" * (words + 1), max_tokens=1))


def test_the_character_bound_refuses_only_what_cannot_fit(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.anthropic(key)
    # '#' runs are this tokenizer's densest text (about 64 characters a token): a prompt of
    # them that fits is long in characters, and passes the cheap check to be counted exactly.
    dense = client.messages.count_tokens(**body(gateway, "#" * 250_000)).input_tokens
    assert dense < CONTEXT - 1
    assert client.messages.create(**body(gateway, "#" * 250_000, max_tokens=1)).usage.output_tokens == 1
    # Past the context in tokens but not in characters: the exact count says so.
    with pytest.raises(anthropic.BadRequestError, match="tokens > 4095 maximum"):
        client.messages.create(**body(gateway, "#" * 300_000, max_tokens=1))
    # Past the character bound: refused from its length, on both APIs and count_tokens.
    hopeless = "#" * (MAX_CHARS + 1)
    with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ characters cannot fit in 4095"):
        client.messages.create(**body(gateway, hopeless, max_tokens=1))
    with pytest.raises(anthropic.BadRequestError, match="characters cannot fit"):
        client.messages.count_tokens(**body(gateway, hopeless))
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.openai(key).chat.completions.create(**body(gateway, hopeless))
    error = refused.value.response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["message"].startswith("prompt is too long")
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.openai(key).chat.completions.create(**body(gateway, "#" * 300_000))
    assert refused.value.response.json()["error"]["code"] == "context_length_exceeded"


def test_a_body_too_large_for_any_fitting_prompt_is_413_before_it_is_read(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    limit = MAX_BODY_BYTES
    headers = {"x-api-key": key.key, "content-type": "application/json"}
    padding = b" " * (limit + 1 - 2)
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions"):
        declared = httpx.post(f"{gateway.base_url}{path}", content=b"{" + padding + b"}", headers=headers, timeout=60)
        assert declared.status_code == 413, declared.text
        if path.startswith("/v1/chat"):
            assert declared.json()["error"]["code"] == "request_too_large"
        else:
            assert declared.json()["error"]["type"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused once the bound is passed
        yield b"{"
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    streamed = httpx.post(f"{gateway.base_url}/v1/messages", content=chunked(), headers=headers, timeout=60)
    assert streamed.status_code == 413
    # Just under the bound, the same body is read and parsed: an ordinary validation error.
    under = httpx.post(f"{gateway.base_url}/v1/messages", content=b"{" + padding[:-1] + b"}", headers=headers)
    assert under.status_code == 400 and "model: Field required" in under.json()["error"]["message"]


def test_count_tokens_is_rate_limited_and_limits_are_checked_before_the_body_is_read(gateway: GatewayServer) -> None:
    key = gateway.new_key(requests_per_minute=3)
    client = gateway.anthropic(key)
    raw = client.messages.with_raw_response.count_tokens(**body(gateway, "hello"))
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "2"
    client.messages.create(**body(gateway, "hello", max_tokens=1))  # the same bucket
    client.messages.count_tokens(**body(gateway, "hello"))
    with pytest.raises(anthropic.RateLimitError):
        client.messages.count_tokens(**body(gateway, "hello"))
    # Over the limit, a body is not even parsed: a 429, not the 400 this one would get.
    garbage = httpx.post(
        f"{gateway.base_url}/v1/messages/count_tokens",
        content=b"{not json",
        headers={"x-api-key": key.key, "content-type": "application/json"},
    )
    assert garbage.status_code == 429
    # Counting tokens reserves no input tokens: a key whose input-token bucket is empty may still count.
    itpm = gateway.new_key(input_tokens_per_minute=10)
    gateway.anthropic(itpm).messages.create(**body(gateway, "hello " * 40, max_tokens=1))
    with pytest.raises(anthropic.RateLimitError):
        gateway.anthropic(itpm).messages.create(**body(gateway, "hello", max_tokens=1))
    assert gateway.anthropic(itpm).messages.count_tokens(**body(gateway, "hello")).input_tokens > 0


def test_the_openapi_schema_still_describes_the_bodies(gateway: GatewayServer) -> None:
    schema = gateway.app.openapi()
    for path, model in (
        ("/v1/messages", "MessagesRequest"),
        ("/v1/messages/count_tokens", "CountTokensRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
    ):
        request_body = schema["paths"][path]["post"]["requestBody"]
        assert request_body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
        assert "max_tokens" in schema["components"]["schemas"][model]["properties"] or model == "CountTokensRequest"


def test_the_event_loop_stays_responsive_while_huge_requests_are_in_flight(gateway: GatewayServer) -> None:
    """/healthz and another tenant's small count_tokens answer within a second while one tenant sends
    a 30 MB body, several near-limit count_tokens (each takes the tokenizer most of a second) and a
    body of 150,000 one-character blocks (seconds of JSON parsing and validation, holding the GIL).

    Today's code froze for the whole of the 30 MB body's tokenizing (a minute here)."""
    attacker, neighbour = gateway.new_key(), gateway.new_key()
    headers = {"x-api-key": attacker.key, "content-type": "application/json"}
    huge = httpx.Request("POST", "/", json=body(gateway, "x" * 30_000_000, max_tokens=1)).content
    near_limit = httpx.Request("POST", "/", json=body(gateway, "hello " * 54_000)).content
    blocks = [{"type": "text", "text": "a"}] * 150_000
    many_blocks = {"model": gateway.model, "max_tokens": 1, "messages": [{"role": "user", "content": blocks}]}
    many = httpx.Request("POST", "/", json=many_blocks).content
    assert len(near_limit) < MAX_BODY_BYTES and len(many) < MAX_BODY_BYTES
    statuses: list[int] = []

    def attack(path: str, content: bytes) -> None:
        try:
            response = httpx.post(f"{gateway.base_url}{path}", content=content, headers=headers, timeout=120)
            statuses.append(response.status_code)
        except httpx.HTTPError:
            statuses.append(0)

    attacks = [threading.Thread(target=attack, args=("/v1/messages", huge))]
    attacks += [threading.Thread(target=attack, args=("/v1/messages/count_tokens", near_limit)) for _ in range(3)]
    attacks.append(threading.Thread(target=attack, args=("/v1/messages", many)))
    small = body(gateway, "Hello")
    worst = 0.0
    with httpx.Client(base_url=gateway.base_url, timeout=10, headers={"x-api-key": neighbour.key}) as client:
        client.get("/healthz")
        for thread in attacks:
            thread.start()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline or any(t.is_alive() for t in attacks):
            started = time.monotonic()
            assert client.get("/healthz").status_code == 200
            # The whole request path but the engine (whose speed is the machine's): auth, limits, parsing, tokenizing.
            response = client.post("/v1/messages/count_tokens", json=small)
            assert response.status_code == 200, response.text
            worst = max(worst, time.monotonic() - started)
            if time.monotonic() > deadline + 60:
                break
            time.sleep(0.05)
        generated = client.post("/v1/messages", json=small | {"max_tokens": 1})
        assert generated.status_code == 200, generated.text
    for thread in attacks:
        thread.join(timeout=60)
    assert worst < 1.0, f"the gateway stopped answering for {worst:.2f} s"
    assert sorted(statuses) == [200, 200, 200, 400, 413], statuses


def test_admin_bodies_are_capped_at_one_mib(gateway: GatewayServer) -> None:
    # FastAPI parses admin bodies on the event loop, before the admin token is checked.
    headers = {"authorization": "Bearer wrong", "content-type": "application/json"}
    big = b'{"name": "' + b"x" * (1024 * 1024) + b'"}'
    refused = httpx.post(f"{gateway.base_url}/admin/v1/tenants", content=big, headers=headers)
    assert refused.status_code == 413 and refused.json()["error"]["type"] == "request_too_large"
    small = httpx.post(f"{gateway.base_url}/admin/v1/tenants", content=b'{"name": "x"}', headers=headers)
    assert small.status_code == 401
