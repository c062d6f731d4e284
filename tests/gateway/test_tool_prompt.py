"""Tools in the prompt (generic format and a tool-capable template), tool_choice grammars, and 400s for bad history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.prompt import PromptRenderer
from gateway.protocols import anthropic, openai
from gateway.tools.choice import ToolChoice, forcing_grammar
from kvgate.errors import InvalidRequestError
from tests.gateway.tool_fixtures import TOOL_TEMPLATE, anthropic_tools, openai_tools

SYSTEM = "You are a weather assistant. Answer in one sentence."


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def renderer(tokenizer: Any, template: str | None = None) -> PromptRenderer:
    def apply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        kwargs: dict[str, Any] = {"chat_template": template} if template else {}
        if tools:
            kwargs["tools"] = tools
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    return PromptRenderer(apply_chat_template=apply, tokenizer=tokenizer)


def message_request(**body: Any) -> anthropic.MessagesRequest:
    return anthropic.MessagesRequest.model_validate({"model": "m", "max_tokens": 8, **body})


def chat_request(**body: Any) -> openai.ChatCompletionRequest:
    return openai.ChatCompletionRequest.model_validate({"model": "m", **body})


def turn_one() -> dict[str, Any]:
    return {
        "tools": anthropic_tools(),
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
    }


def turn_two() -> dict[str, Any]:
    body = turn_one()
    call = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny"}
    body["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, call]},
        {"role": "user", "content": [{**result, "cache_control": {"type": "ephemeral"}}]},
    ]
    return body


@pytest.mark.parametrize("template", [None, TOOL_TEMPLATE], ids=["generic", "native"])
def test_turn_two_extends_turn_one_token_for_token(tokenizer: Any, template: str | None) -> None:
    r = renderer(tokenizer, template)
    first = r.render(anthropic.to_chat(message_request(**turn_one())))
    again = r.render(anthropic.to_chat(message_request(**turn_one())))
    second = r.render(anthropic.to_chat(message_request(**turn_two())))
    assert first == again
    # Everything before the generation prompt is shared, tokens included.
    head = first.text.removesuffix("<|im_start|>assistant\n")
    assert second.text.startswith(head) and len(head) < len(first.text)
    shared = len(tokenizer(head, add_special_tokens=False)["input_ids"])
    assert second.token_ids[:shared] == first.token_ids[:shared]
    assert '"name": "get_weather"' in first.text and "18C, sunny" in second.text


def test_generic_format_order_and_breakpoints(tokenizer: Any) -> None:
    r = renderer(tokenizer)
    rendered = r.render(anthropic.to_chat(message_request(**turn_two())))
    text = rendered.text
    # Tools, then system, then messages.
    assert (
        text.index("<tools>") < text.index('"name": "get_time"') < text.index(SYSTEM) < text.index("Weather in Paris")
    )
    tool_bp, system_bp, result_bp = rendered.breakpoints

    def upto(end: int) -> str:
        return tokenizer.decode(rendered.token_ids[:end])

    last_tool = json.dumps({"name": "get_time", "description": "The current time in a time zone."})[:-1]
    assert last_tool in upto(tool_bp.token_end) and "</tools>" not in upto(tool_bp.token_end)
    assert upto(system_bp.token_end).endswith(SYSTEM)
    assert upto(result_bp.token_end).endswith("</tool_response>")
    assert "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}) in text
    assert json.dumps({"tool_call_id": "toolu_01", "name": "get_weather", "content": "18C, sunny"}) in text


def test_native_template_gets_tool_calls_and_tool_messages(tokenizer: Any) -> None:
    r = renderer(tokenizer, TOOL_TEMPLATE)
    assert r.supports_tools()
    rendered = r.render(anthropic.to_chat(message_request(**turn_two())))
    assert "# Tools\n<tools>" in rendered.text and "You may call" not in rendered.text  # not the generic preamble
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in rendered.text
    assert "<tool_response>\n18C, sunny\n</tool_response>" in rendered.text
    *_, result_bp = rendered.breakpoints
    assert tokenizer.decode(rendered.token_ids[: result_bp.token_end]).endswith("18C, sunny")


def test_openai_history_renders_like_anthropic(tokenizer: Any) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    request = chat_request(
        tools=openai_tools(),
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        ],
    )
    text = renderer(tokenizer).render(openai.to_chat(request)).text
    call_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert text.index("<tools>") < text.index(SYSTEM) < text.index(call_text) < text.index("<tool_response>\n{")
    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_every_tool_choice_renders_the_same_prompt(tokenizer: Any) -> None:
    # Forcing is grammar alone: the tools and the system text stay byte-identical (and cached) across choices.
    r = renderer(tokenizer)
    auto = r.render(anthropic.to_chat(message_request(**turn_one()))).text
    for choice in ({"type": "none"}, {"type": "any"}, {"type": "tool", "name": "get_time"}, {"type": "auto"}):
        chosen = r.render(anthropic.to_chat(message_request(**turn_one(), tool_choice=choice))).text
        assert chosen == auto, choice
    assert "<tools>" in auto and SYSTEM in auto


def test_forcing_grammar_accepts_only_calls_of_the_chosen_tools(tokenizer: Any) -> None:
    import llguidance
    import llguidance.hf

    assert forcing_grammar(openai_tools(), ToolChoice("auto")) is None
    lltok = llguidance.hf.from_tokenizer(tokenizer)

    def accepts(choice: ToolChoice, text: str) -> bool:
        grammar = forcing_grammar(openai_tools(), choice)
        assert grammar is not None and grammar.kind == "grammar"
        matcher = llguidance.LLMatcher(lltok, llguidance.grammar_from("lark", grammar.value))
        matcher.consume_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])
        return not matcher.is_error() and matcher.is_accepting()

    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    time = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    assert accepts(ToolChoice("any"), weather) and accepts(ToolChoice("any"), time)
    assert accepts(ToolChoice("tool", "get_weather"), weather)
    assert not accepts(ToolChoice("tool", "get_weather"), time)
    assert not accepts(ToolChoice("any"), weather.replace('"city"', '"town"'))  # city is required
    assert not accepts(ToolChoice("any"), "Sure! " + weather)


def test_forced_choices_set_the_grammar_in_sampling(tokenizer: Any) -> None:
    from gateway.services.completions import PrepareContext, prepare_chat_completion, prepare_message

    ctx = PrepareContext("m", 4096, 64, renderer(tokenizer))
    forced = prepare_message(ctx, request=message_request(**turn_one(), tool_choice={"type": "any"}))
    assert forced.sampling.structured is not None and forced.tools is not None and forced.tools.max_calls == 1
    auto = prepare_message(ctx, request=message_request(**turn_one()))
    assert auto.sampling.structured is None and auto.tools is not None and auto.tools.max_calls is None
    messages = [{"role": "user", "content": "hi"}]
    required = prepare_chat_completion(
        ctx, request=chat_request(messages=messages, tools=openai_tools(), tool_choice="required")
    )
    assert required.sampling.structured is not None
    none = prepare_chat_completion(
        ctx, request=chat_request(messages=messages, tools=openai_tools(), tool_choice="none")
    )
    assert none.sampling.structured is None and none.tools is None


def _anthropic_error(body: dict[str, Any]) -> str:
    with pytest.raises(InvalidRequestError) as info:
        anthropic.to_chat(message_request(**body))
    return str(info.value)


def test_anthropic_history_errors() -> None:
    good = turn_two()
    anthropic.to_chat(message_request(**good))  # the positive: the pair is fine
    orphan = turn_two()
    orphan["messages"][2]["content"][0]["tool_use_id"] = "toolu_other"
    assert "unexpected `tool_use_id`" in _anthropic_error(orphan)
    unanswered = turn_two()
    unanswered["messages"][2] = {"role": "user", "content": "no result"}
    assert "without `tool_result` blocks immediately after: toolu_01" in _anthropic_error(unanswered)
    misplaced = turn_one()
    misplaced["messages"] = [
        {"role": "user", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]}
    ]
    assert "only be in assistant messages" in _anthropic_error(misplaced)
    no_tools = turn_two()
    del no_tools["tools"]
    assert "must define tools" in _anthropic_error(no_tools)
    assert "no tool named 'nope'" in _anthropic_error({**turn_one(), "tool_choice": {"type": "tool", "name": "nope"}})
    assert "tool_choice" in _anthropic_error({**turn_one(), "tool_choice": {"type": "sometimes"}})
    assert "boolean disable_parallel" in _anthropic_error(
        {**turn_one(), "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}}
    )
    assert "needs tools" in _anthropic_error({"messages": turn_one()["messages"], "tool_choice": {"type": "any"}})
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with_image = turn_two()
    with_image["messages"][2]["content"][0]["content"] = [image]
    assert "type 'image' are not supported" in _anthropic_error(with_image)


def _openai_error(messages: list[dict[str, Any]], **body: Any) -> str:
    with pytest.raises(InvalidRequestError) as info:
        openai.to_chat(chat_request(messages=messages, tools=openai_tools(), **body))
    return str(info.value)


def test_openai_history_errors() -> None:
    def call(arguments: str = '{"city": "Paris"}', call_id: str = "call_1") -> dict[str, Any]:
        function = {"name": "get_weather", "arguments": arguments}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        }

    user = {"role": "user", "content": "Weather?"}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
    chat = openai.to_chat(chat_request(messages=[user, call(), result], tools=openai_tools()))
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]
    assert "must be a JSON object" in _openai_error([user, call("{not json"), result])
    assert "must be a JSON object" in _openai_error([user, call("[1]"), result])
    assert "did not have response messages: call_1" in _openai_error([user, call(), user])
    assert "preceding message with 'tool_calls'" in _openai_error([user, {**result, "tool_call_id": "call_9"}])
    assert "tool_call_id" in _openai_error([user, call(), {"role": "tool", "content": "18C"}])
    assert "deprecated function-calling" in _openai_error([user, {"role": "function", "name": "f", "content": "x"}])
    assert "no function named 'nope'" in _openai_error(
        [user], tool_choice={"type": "function", "function": {"name": "nope"}}
    )
    with pytest.raises(InvalidRequestError, match="only allowed when 'tools'"):
        openai.to_chat(chat_request(messages=[user], tool_choice="required"))


def test_forced_calls_whose_parameters_use_defs_compile_and_follow_their_refs(tokenizer: Any) -> None:
    """Pydantic puts nested models in $defs; moved under "arguments" they still resolve (issue 25)."""
    import llguidance
    import llguidance.hf
    from pydantic import BaseModel

    from inference.grammar import check_structured

    class Address(BaseModel):
        city: str
        zip: int

    class Order(BaseModel):
        ship_to: Address
        bill_to: Address | None = None

    parameters = Order.model_json_schema()
    assert "$defs" in parameters  # what makes the test mean something
    tools = [{"type": "function", "function": {"name": "place_order", "parameters": parameters}}]
    grammar = forcing_grammar(tools, ToolChoice("any"))
    assert grammar is not None
    check_structured(grammar)  # was: "Pointer does not exist"
    lltok = llguidance.hf.from_tokenizer(tokenizer)

    def accepts(arguments: str) -> bool:
        matcher = llguidance.LLMatcher(lltok, llguidance.grammar_from("lark", grammar.value))
        text = '<tool_call>\n{"name": "place_order", "arguments": ' + arguments + "}\n</tool_call>"
        matcher.consume_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])
        return not matcher.is_error() and matcher.is_accepting()

    assert accepts('{"ship_to": {"city": "Paris", "zip": 75001}}')
    assert not accepts('{"ship_to": {"city": "Paris", "zip": "75001"}}')  # the $ref's zip is an integer
    # A schema that refers to its own root ("#") recurses into the arguments, not the call.
    recursive = {"type": "object", "properties": {"child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}
    tree = forcing_grammar([{"name": "tree", "parameters": recursive}], ToolChoice("any"))
    assert tree is not None
    check_structured(tree)


def test_forcing_grammar_names_added_tag_tokens_as_tokens() -> None:
    added = {"<tool_call>": 151657, "</tool_call>": 151658}
    as_tokens = forcing_grammar(openai_tools(), ToolChoice("any"), added.get)
    as_text = forcing_grammar(openai_tools(), ToolChoice("any"))
    assert as_tokens is not None and as_text is not None
    assert as_tokens.value.startswith('start: <[151657]> "\\n" call "\\n" <[151658]>\n')
    assert as_text.value.startswith('start: "<tool_call>" "\\n" call "\\n" "</tool_call>"\n')
