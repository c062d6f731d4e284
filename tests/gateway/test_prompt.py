"""Rendering with the chat template and locating breakpoints as token offsets (SmolLM2's tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.prompt import Chat, ChatMessage, PromptRenderer, TextPart, ToolDef
from kvgate.errors import InvalidRequestError

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRIM_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def renderer_for(tokenizer: Any, template: str | None = None) -> PromptRenderer:
    def apply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        kwargs: dict[str, Any] = {"chat_template": template} if template else {}
        if tools:
            kwargs["tools"] = tools
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    return PromptRenderer(apply_chat_template=apply, tokenizer=tokenizer)


def prefix(tokenizer: Any, ids: list[int], end: int) -> str:
    return tokenizer.decode(ids[:end])


SYSTEM = "You are a careful assistant who answers briefly. " * 6


def test_breakpoints_end_where_their_blocks_end(tokenizer: Any) -> None:
    chat = Chat(
        messages=(
            ChatMessage("system", (TextPart(SYSTEM.strip(), ttl_s=3600),)),
            ChatMessage("user", (TextPart("First block."), TextPart("Second block, cached.", ttl_s=300))),
            ChatMessage("assistant", (TextPart("Sure."),)),
            ChatMessage("user", (TextPart("And now?"),)),
        )
    )
    rendered = renderer_for(tokenizer).render(chat)
    assert rendered.token_ids == tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
    system_bp, user_bp = rendered.breakpoints
    assert (system_bp.ttl_s, user_bp.ttl_s) == (3600, 300)
    assert prefix(tokenizer, rendered.token_ids, system_bp.token_end).endswith(SYSTEM.strip())
    assert prefix(tokenizer, rendered.token_ids, user_bp.token_end).endswith("First block.\n\nSecond block, cached.")
    # Exactly at the end: one more token is past the block.
    assert not prefix(tokenizer, rendered.token_ids, user_bp.token_end + 1).endswith("cached.")
    assert rendered.text.endswith("<|im_start|>assistant\n")


def test_a_breakpoint_on_an_inner_block_stops_inside_the_message(tokenizer: Any) -> None:
    chat = Chat(messages=(ChatMessage("user", (TextPart("Alpha beta.", ttl_s=300), TextPart("Gamma delta."))),))
    rendered = renderer_for(tokenizer).render(chat)
    (bp,) = rendered.breakpoints
    text = prefix(tokenizer, rendered.token_ids, bp.token_end)
    assert text.endswith("Alpha beta.") and "Gamma" not in text


def test_a_final_assistant_message_is_a_prefill(tokenizer: Any) -> None:
    chat = Chat(messages=(ChatMessage("user", (TextPart("Say hi"),)), ChatMessage("assistant", (TextPart("Hi,"),))))
    rendered = renderer_for(tokenizer).render(chat)
    assert rendered.text.endswith("<|im_start|>assistant\nHi,")


def test_no_breakpoints_renders_once_and_has_none(tokenizer: Any) -> None:
    rendered = renderer_for(tokenizer).render(Chat(messages=(ChatMessage("user", (TextPart("hello"),)),)))
    assert rendered.breakpoints == [] and rendered.token_ids


def test_tools_take_the_generic_format_when_the_template_ignores_them(tokenizer: Any) -> None:
    tool = ToolDef({"type": "function", "function": {"name": "f", "description": "", "parameters": {}}})
    chat = Chat(messages=(ChatMessage("user", (TextPart("hi"),)),), tools=(tool,))
    renderer = renderer_for(tokenizer)
    assert not renderer.supports_tools()
    assert (
        '<tools>\n{"name": "f", "description": "", "parameters": {"type": "object", "properties": {}}}\n</tools>'
        in renderer.render(chat).text
    )


def _tool(name: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "description": f"{name} things", "parameters": schema}}


@pytest.mark.parametrize("index", [0, 1])
def test_tool_breakpoints_end_after_the_tool(tokenizer: Any, index: int) -> None:
    tools = (ToolDef(_tool("get_weather"), ttl_s=3600 if index == 0 else None), ToolDef(_tool("get_time")))
    if index == 1:
        tools = (ToolDef(_tool("get_weather")), ToolDef(_tool("get_time"), ttl_s=3600))
    chat = Chat(messages=(ChatMessage("user", (TextPart("What is the weather?", ttl_s=300),)),), tools=tools)
    renderer = renderer_for(tokenizer, TOOLS_TEMPLATE)
    assert renderer.supports_tools()
    rendered = renderer.render(chat)
    tool_bp, message_bp = rendered.breakpoints
    text = prefix(tokenizer, rendered.token_ids, tool_bp.token_end)
    tool_json = json.dumps(_tool(("get_weather", "get_time")[index]))
    tool_end = rendered.text.index(tool_json) + len(tool_json)
    # Up to the tool's end, less at most the one token that straddles it (here "}\n").
    assert rendered.text.startswith(text) and tool_end - 4 <= len(text) <= tool_end
    assert len(prefix(tokenizer, rendered.token_ids, tool_bp.token_end + 1)) > tool_end
    assert prefix(tokenizer, rendered.token_ids, message_bp.token_end).endswith("What is the weather?")
    assert tool_bp.token_end < message_bp.token_end


def test_a_template_that_rewrites_text_never_gets_an_offset_past_the_block(tokenizer: Any) -> None:
    chat = Chat(messages=(ChatMessage("user", (TextPart("Padded block   ", ttl_s=300), TextPart("tail"))),))
    rendered = renderer_for(tokenizer, TRIM_TEMPLATE).render(chat)
    (bp,) = rendered.breakpoints
    cached = prefix(tokenizer, rendered.token_ids, bp.token_end)
    assert rendered.text.startswith(cached)
    assert "tail" not in cached


def test_a_lone_assistant_message_is_a_clear_error(tokenizer: Any) -> None:
    with pytest.raises(InvalidRequestError, match="needs a user message"):
        renderer_for(tokenizer).render(Chat(messages=(ChatMessage("assistant", (TextPart("Hi"),)),)))
    alternating = (
        "{% for m in messages %}{% if loop.index0 % 2 == 0 and m.role != 'user' %}"
        "{{ raise_exception('Roles must alternate') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    with pytest.raises(InvalidRequestError, match="Roles must alternate"):
        renderer_for(tokenizer, alternating).render(Chat(messages=(ChatMessage("system", (TextPart("x"),)),)))


def test_the_direct_tokenizer_path_gives_what_the_tokenizer_call_gives(tokenizer: Any) -> None:
    renderer = renderer_for(tokenizer)
    assert renderer._backend is not None  # the tiny model's tokenizer is a fast one: the direct path is taken
    texts = [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi  there\t!<|im_end|>\n",
        "Unicode: naïve café — 東京 🚀, and numbers 1234567.",
        "",
    ]
    for text in texts:
        expected = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = renderer._encode(text, offsets=True)
        assert ids == expected["input_ids"] and [tuple(o) for o in offsets] == [
            tuple(o) for o in expected["offset_mapping"]
        ]
    # A call that leaves truncation set on the shared backend: the direct path must not truncate.
    tokenizer("warm " * 50, truncation=True, max_length=4)
    assert tokenizer.backend_tokenizer.truncation is not None
    long = "a longer text " * 20
    assert renderer._encode(long, offsets=False)[0] == tokenizer(long, add_special_tokens=False)["input_ids"]
    assert len(renderer._encode(long, offsets=False)[0]) > 4


def test_markers_are_stripped_and_only_this_requests_markers_count() -> None:
    from gateway.prompt import _strip_markers

    opening = "<<kvgate-bp-00112233aabbccdd-"
    fake = "<<kvgate-bp-ffffffffffffffff-0>>"
    marked = f"ab{opening}0>>cd{fake}e{opening}1>>{opening}x>>f{opening}1>>"
    stripped, positions = _strip_markers(marked, opening)
    assert stripped == f"abcd{fake}e{opening}x>>f"
    assert positions == {0: 2, 1: 5 + len(fake)}
    assert _strip_markers("plain text", opening) == ("plain text", {})
