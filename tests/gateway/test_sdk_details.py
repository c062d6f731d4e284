"""Small things the official SDKs see: request ids, empty replies, a too-long prompt's error code."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest

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
