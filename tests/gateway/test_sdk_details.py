"""Small things the official SDKs see: request ids, empty replies, a too-long prompt's error code, input token
counts, usage.cost, rate-limit header names, service_tier, 401 wording, betas and penalty errors."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.ratelimit import openai_rate_headers
from tests.gateway.harness import GatewayServer

QUESTION = [{"role": "user", "content": "Name a colour."}]


def test_request_ids_reach_both_sdks(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    completion = gateway.openai(key).chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION)
    assert completion._request_id is not None and completion._request_id.startswith("req_")
    message = gateway.anthropic(key).messages.create(model=gateway.model, max_tokens=2, messages=QUESTION)
    assert message._request_id is not None and message._request_id.startswith("req_")
    assert message._request_id != completion._request_id
    # On errors too, in both headers, and the id is the one in the usage record.
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.openai(key).chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION, n=2)
    assert refused.value.request_id is not None and refused.value.request_id.startswith("req_")
    raw = gateway.openai(key).chat.completions.with_raw_response.create(
        model=gateway.model, max_tokens=2, messages=QUESTION
    )
    assert raw.headers["x-request-id"] == raw.headers["request-id"]
    assert gateway.usage_record(raw.headers["x-request-id"]) is not None


def first_text(client: anthropic.Anthropic, model: str) -> str:
    """What the model starts its (greedy) reply with."""
    # The current SDK sends temperature through extra_body.
    message = client.messages.create(model=model, max_tokens=4, messages=QUESTION, extra_body={"temperature": 0})
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip(), "the model's reply starts with nothing printable"
    return text.strip()[0]


def test_an_empty_reply_has_no_content_block(gateway: GatewayServer) -> None:
    client = gateway.anthropic(gateway.new_key())
    # A stop sequence the greedy reply starts with (after any whitespace) leaves nothing of it.
    stop = first_text(client, gateway.model)
    body: dict[str, Any] = {
        "model": gateway.model,
        "max_tokens": 8,
        "extra_body": {"temperature": 0},
        "messages": QUESTION,
        "stop_sequences": [stop],
    }
    message = client.messages.create(**body)
    texts = "".join(block.text for block in message.content if block.type == "text")
    if texts.strip():  # pragma: no cover - the reply began with whitespace the stop did not cover
        pytest.skip("the greedy reply did not start with the stop sequence")
    assert message.stop_reason == "stop_sequence" and message.content == []
    with client.messages.stream(**body) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content == [] and final.stop_reason == "stop_sequence"
    assert "content_block_start" not in events and events[-2:] == ["message_delta", "message_stop"]
    # Positive control: without the stop sequence the same request has its text block.
    full = client.messages.create(**{**body, "stop_sequences": []})
    assert [block.type for block in full.content] == ["text"] and full.content[0].text
    # An empty text block sent back is refused, as at Anthropic.
    with pytest.raises(anthropic.BadRequestError, match="text content blocks must be non-empty"):
        client.messages.create(
            **{
                **body,
                "messages": [
                    *QUESTION,
                    {"role": "assistant", "content": [{"type": "text", "text": ""}]},
                    {"role": "user", "content": "Again?"},
                ],
            }
        )


def test_a_prompt_past_the_context_is_context_length_exceeded(gateway: GatewayServer) -> None:
    client = gateway.openai(gateway.new_key())
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=gateway.model, max_tokens=2, messages=[{"role": "user", "content": "word " * 6000}]
        )
    error = refused.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert error["type"] == "invalid_request_error"
    # A prompt that fits is answered.
    assert client.chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION).choices


def test_where_streamers_find_the_cost(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    gateway.billing.price[key.tenant_id] = Decimal("0.000123")
    with gateway.anthropic(key).messages.stream(model=gateway.model, max_tokens=3, messages=QUESTION) as stream:
        deltas = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    # On the message_delta event (an extra field the SDK keeps), not on the helper's final message.
    assert Decimal(str(deltas[-1].usage.cost_usd)) == Decimal("0.000123")
    assert "cost_usd" not in (final.usage.model_extra or {})
    chunks = list(
        gateway.openai(key).chat.completions.create(
            model=gateway.model,
            max_tokens=3,
            messages=QUESTION,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert Decimal(str(chunks[-1].usage.cost_usd)) == Decimal("0.000123")


TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_responses_input_tokens_count_what_a_response_renders(gateway: GatewayServer) -> None:
    client = gateway.openai(gateway.new_key())
    body: dict[str, Any] = {"instructions": "Be brief.", "input": "Name a colour.", "tools": [TOOL]}
    counted = client.responses.input_tokens.count(model=gateway.model, **body)
    assert counted.object == "response.input_tokens"
    response = client.responses.create(model=gateway.model, max_output_tokens=1, store=False, **body)
    assert response.usage is not None and counted.input_tokens == response.usage.input_tokens
    # The model may be left out (the served one); fewer parts count fewer tokens.
    assert client.responses.input_tokens.count(**body).input_tokens == counted.input_tokens
    bare = client.responses.input_tokens.count(model=gateway.model, input="Name a colour.")
    assert 0 < bare.input_tokens < counted.input_tokens
    # What /v1/responses refuses, counting refuses the same way, in OpenAI's shape.
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.input_tokens.count(model="no-such-model", input="hi")
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(model=gateway.model, input="hi", truncation="auto")
    assert refused.value.body["param"] == "truncation"


def test_a_wrong_method_on_an_openai_route_has_a_code(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    headers = {"authorization": f"Bearer {key.key}"}
    url = f"{gateway.base_url}/v1/responses/input_tokens"
    wrong = httpx.put(url, json={"input": "hi"}, headers=headers)
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]
    error = wrong.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "method_not_allowed")
    assert "PUT /v1/responses/input_tokens" in error["message"]
    # The right method on the same path is answered.
    assert httpx.post(url, json={"input": "hi"}, headers=headers).json()["object"] == "response.input_tokens"


def test_usage_cost_is_a_number_beside_cost_usd(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    gateway.billing.price[key.tenant_id] = Decimal("0.000123")
    message = gateway.anthropic(key).messages.create(model=gateway.model, max_tokens=2, messages=QUESTION)
    extra = message.usage.model_extra or {}
    assert extra["cost"] == pytest.approx(0.000123) and isinstance(extra["cost"], float)
    assert Decimal(extra["cost_usd"]) == Decimal("0.000123")
    with gateway.anthropic(key).messages.stream(model=gateway.model, max_tokens=2, messages=QUESTION) as stream:
        delta = [event for event in stream if event.type == "message_delta"][-1]
    assert delta.usage.cost == pytest.approx(0.000123)  # type: ignore[attr-defined]
    openai_client = gateway.openai(key)
    completion = openai_client.chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION)
    assert completion.usage is not None and completion.usage.cost == pytest.approx(0.000123)  # type: ignore[attr-defined]
    chunks = list(
        openai_client.chat.completions.create(
            model=gateway.model, max_tokens=2, messages=QUESTION, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.cost == pytest.approx(0.000123)  # type: ignore[union-attr]
    response = openai_client.responses.create(model=gateway.model, max_output_tokens=2, input="Hi", store=False)
    assert response.usage is not None and response.usage.cost == pytest.approx(0.000123)  # type: ignore[attr-defined]
    # Without a settled cost neither field is there.
    unpriced = gateway.openai(gateway.new_key()).chat.completions.create(
        model=gateway.model, max_tokens=2, messages=QUESTION
    )
    assert unpriced.usage is not None and "cost" not in (unpriced.usage.model_extra or {})


def test_rate_limit_headers_use_each_apis_names(gateway: GatewayServer) -> None:
    key = gateway.new_key(requests_per_minute=3, input_tokens_per_minute=100_000)
    raw = gateway.openai(key).chat.completions.with_raw_response.create(
        model=gateway.model, max_tokens=2, messages=QUESTION
    )
    assert raw.headers["x-ratelimit-limit-requests"] == "3"
    assert raw.headers["x-ratelimit-remaining-requests"] == "2"
    assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 100_000
    assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
    assert not any(name.startswith("anthropic-ratelimit-") for name in raw.headers)
    anthropic_raw = gateway.anthropic(key).messages.with_raw_response.create(
        model=gateway.model, max_tokens=2, messages=QUESTION
    )
    assert anthropic_raw.headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert not any(name.startswith("x-ratelimit-") for name in anthropic_raw.headers)
    gateway.openai(key).chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION)
    with pytest.raises(openai.RateLimitError) as limited:  # the 429 too
        gateway.openai(key).chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION)
    assert limited.value.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_openai_duration_format() -> None:
    headers = [(b"anthropic-ratelimit-requests-reset", b"1970-01-01T00:06:00Z"), (b"content-type", b"x")]
    assert openai_rate_headers(headers, now=0.0) == [(b"x-ratelimit-reset-requests", b"6m0s"), (b"content-type", b"x")]
    reset = [(b"anthropic-ratelimit-input-tokens-reset", b"1970-01-01T01:00:17Z")]
    assert openai_rate_headers(reset, now=0.0) == [(b"x-ratelimit-reset-tokens", b"1h0m17s")]
    assert openai_rate_headers(reset, now=3617.0) == [(b"x-ratelimit-reset-tokens", b"0s")]


def test_service_tier(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.openai(key)
    assert client.chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION).service_tier == (
        "default"
    )
    chunks = list(client.chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION, stream=True))
    assert {chunk.service_tier for chunk in chunks} == {"default"}
    response = client.responses.create(model=gateway.model, max_output_tokens=2, input="Hi", store=False)
    assert response.service_tier == "default"
    message = gateway.anthropic(key).messages.create(model=gateway.model, max_tokens=2, messages=QUESTION)
    assert message.usage.service_tier == "standard"


def test_a_bad_key_is_refused_naming_the_header_it_came_in(gateway: GatewayServer) -> None:
    good = gateway.new_key()
    url = f"{gateway.base_url}/v1/messages"
    body = {"model": gateway.model, "max_tokens": 2, "messages": QUESTION}
    for bad in ("sk-kvgate-not-a-real-key", "x"):
        with pytest.raises(openai.AuthenticationError) as bearer:
            gateway.openai(bad).chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION)
        assert "Authorization: Bearer" in bearer.value.message and "x-api-key" not in bearer.value.message
        assert bearer.value.body["code"] == "invalid_api_key"
        # The anthropic SDK sends its api_key as a Bearer token too.
        with pytest.raises(anthropic.AuthenticationError, match="Authorization: Bearer"):
            gateway.anthropic(bad).messages.create(**body)
        # An x-api-key failure keeps its message.
        refused = httpx.post(url, json=body, headers={"x-api-key": bad})
        assert refused.status_code == 401 and refused.json()["error"]["message"] == "invalid x-api-key"
    # The good key works in either header.
    assert gateway.openai(good).chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION).choices
    assert httpx.post(url, json=body, headers={"x-api-key": good.key}).status_code == 200


def test_unknown_anthropic_betas_are_refused(gateway: GatewayServer) -> None:
    client = gateway.anthropic(gateway.new_key())
    body: dict[str, Any] = {"model": gateway.model, "max_tokens": 2, "messages": QUESTION}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            **body, extra_headers={"anthropic-beta": "prompt-caching-2024-07-31,files-api-2025-04-14"}
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert (
        "`files-api-2025-04-14`" in refused.value.message and "prompt-caching-2024-07-31`" not in refused.value.message
    )
    with pytest.raises(anthropic.BadRequestError, match="no-such-beta"):
        client.messages.count_tokens(
            model=gateway.model, messages=QUESTION, extra_headers={"anthropic-beta": "no-such-beta"}
        )
    # Betas kvgate takes, as the SDK sends them (its beta count_tokens adds token-counting).
    betas = ["prompt-caching-2024-07-31", "extended-cache-ttl-2025-04-11"]
    assert client.beta.messages.create(**body, betas=betas).content is not None
    assert client.beta.messages.count_tokens(model=gateway.model, messages=QUESTION).input_tokens > 0
    assert (
        client.messages.create(
            **body, extra_headers={"anthropic-beta": "output-128k-2025-02-19, token-counting-2024-11-01"}
        ).content
        is not None
    )


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_a_penalty_error_names_its_field(gateway: GatewayServer, penalty: str) -> None:
    client = gateway.openai(gateway.new_key())
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION, **{penalty: 0.5})
    assert refused.value.body["param"] == penalty and refused.value.body["message"].startswith(f"{penalty}:")
    with pytest.raises(openai.BadRequestError) as legacy:
        client.completions.create(model=gateway.model, max_tokens=2, prompt="Hi", **{penalty: 0.5})
    assert legacy.value.body["param"] == penalty
    # A zero penalty is no penalty: answered.
    assert client.chat.completions.create(model=gateway.model, max_tokens=2, messages=QUESTION, **{penalty: 0}).choices
