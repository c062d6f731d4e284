"""Request models and their translation: breakpoint rules, refusals, and a fuzz of arbitrary JSON."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.protocols import anthropic, openai
from kvgate.errors import InvalidRequestError


def message_request(**body: Any) -> anthropic.MessagesRequest:
    base: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    return anthropic.MessagesRequest.model_validate({**base, **body})


def text(t: str, ttl: str | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": t}
    if ttl:
        block["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return block


def ttls(chat: Any) -> list[int]:
    return [t.ttl_s for t in chat.tools if t.ttl_s] + [p.ttl_s for m in chat.messages for p in m.parts if p.ttl_s]


def test_four_breakpoints_are_fine_five_are_refused_with_the_count() -> None:
    four = message_request(
        system=[text("a", "1h"), text("b", "1h")],
        messages=[
            {"role": "user", "content": [text("c", "5m"), text("d", "5m")]},
        ],
    )
    assert ttls(anthropic.to_chat(four)) == [3600, 3600, 300, 300]
    five = message_request(
        system=[text("a", "1h"), text("b", "1h")],
        messages=[
            {"role": "user", "content": [text("c", "5m"), text("d", "5m"), text("e", "5m")]},
        ],
    )
    with pytest.raises(
        InvalidRequestError, match=r"A maximum of 4 blocks with cache_control may be provided. Found 5."
    ):
        anthropic.to_chat(five)


def test_1h_after_5m_is_refused_and_5m_after_1h_is_fine() -> None:
    bad = message_request(system=[text("a", "5m")], messages=[{"role": "user", "content": [text("b", "1h")]}])
    with pytest.raises(InvalidRequestError, match="'1h' must not come after"):
        anthropic.to_chat(bad)
    good = message_request(system=[text("a", "1h")], messages=[{"role": "user", "content": [text("b", "5m")]}])
    assert ttls(anthropic.to_chat(good)) == [3600, 300]


def test_unknown_ttl_and_type_fail_validation() -> None:
    with pytest.raises(ValidationError, match="ttl"):
        message_request(system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "10m"}}])
    with pytest.raises(ValidationError):
        message_request(system=[{"type": "text", "text": "a", "cache_control": {"type": "persistent"}}])


def test_ttl_defaults_to_5m() -> None:
    chat = anthropic.to_chat(
        message_request(system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}])
    )
    assert ttls(chat) == [300]


def test_top_level_cache_control_marks_the_last_block_and_uses_a_slot() -> None:
    request = message_request(
        cache_control={"type": "ephemeral"},
        messages=[
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": [text("three"), text("four")]},
        ],
    )
    chat = anthropic.to_chat(request)
    assert [p.ttl_s for p in chat.messages[-1].parts] == [None, 300]
    assert ttls(chat) == [300]
    crowded = message_request(
        cache_control={"type": "ephemeral"},
        system=[text("a", "5m"), text("b", "5m"), text("c", "5m"), text("d", "5m")],
    )
    with pytest.raises(InvalidRequestError, match="Found 5"):
        anthropic.to_chat(crowded)


def test_unsupported_blocks_and_features_get_clear_errors() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(InvalidRequestError, match="type 'image' are not supported"):
        anthropic.to_chat(message_request(messages=[{"role": "user", "content": [image]}]))
    with pytest.raises(InvalidRequestError, match="must be non-empty"):
        anthropic.to_chat(message_request(messages=[{"role": "user", "content": [text("")]}]))
    with pytest.raises(InvalidRequestError, match="thinking"):
        anthropic.to_chat(message_request(thinking={"type": "enabled", "budget_tokens": 1024}))
    with pytest.raises(InvalidRequestError, match="not supported"):
        anthropic.to_chat(message_request(tools=[{"type": "bash_20250124", "name": "bash"}]))
    with pytest.raises(ValidationError, match="Extra inputs"):
        message_request(unknown_field=1)


@pytest.mark.parametrize("odd_type", [[], {}, 3, None, True])
def test_blocks_and_tools_with_non_string_types_are_validation_errors(odd_type: Any) -> None:
    for body in (
        {"messages": [{"role": "user", "content": [{"type": odd_type, "text": "x"}]}]},
        {"tools": [{"type": odd_type}]},
    ):
        try:
            anthropic.to_chat(message_request(**body))
        except (ValidationError, InvalidRequestError):
            continue
        assert odd_type is None  # a tool without a type is a custom tool, which needs a name


def test_openai_translation_and_refusals() -> None:
    request = openai.ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
        }
    )
    chat = openai.to_chat(request)
    assert [m.role for m in chat.messages] == ["system", "user"]
    # One part per content part (a part may carry a prompt_cache_breakpoint); the renderer joins them.
    assert [p.text for p in chat.messages[1].parts] == ["a", "b"]
    for body, match in [
        ({"n": 2}, "n=1"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "preceding message with 'tool_calls'"),
        ({"logprobs": True}, "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url"),
    ]:
        full = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
        with pytest.raises(InvalidRequestError, match=match):
            openai.to_chat(openai.ChatCompletionRequest.model_validate(full))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
anthropic_keys = st.sampled_from(
    [
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "cache_control",
        "stop_sequences",
        "temperature",
        "top_k",
        "top_p",
        "stream",
        "metadata",
        "thinking",
        "cache_salt",
        "role",
        "content",
        "type",
        "text",
        "ttl",
    ]
)
shaped = st.recursive(
    json_values,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(anthropic_keys, children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=shaped)
def test_any_json_is_either_valid_or_a_clear_client_error(body: Any) -> None:
    for model, translate in (
        (anthropic.MessagesRequest, anthropic.to_chat),
        (openai.ChatCompletionRequest, openai.to_chat),
    ):
        try:
            request = model.model_validate(body)
        except ValidationError:
            continue
        with contextlib.suppress(InvalidRequestError):
            translate(request)
