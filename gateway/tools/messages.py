"""A Chat as the list of message dicts a chat template takes, with its tools rendered natively or generically.

Native (the template renders tools): tool definitions go to the template's `tools`
argument, calls become OpenAI-style `tool_calls` on the assistant message (arguments as
an object, as Hugging Face templates expect) and results become `role: tool` messages.
Generic (gateway.tools.format): the tool preamble opens the system message, calls and
results are text, and a tool result's message joins the user messages around it (user
turns stay alternating with assistant turns, which many templates insist on).

`marker(i)` is appended where breakpoint block i ends (see gateway.prompt). A call in
the native shape has no text of its own to mark: its marker goes at the end of the
assistant message's content, which templates render before the calls, so its
breakpoint ends early rather than late (caching less is safe).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from gateway.prompt import BLOCK_SEPARATOR, Chat, TextPart, ToolCallPart, ToolResultPart
from gateway.tools.format import call_text, preamble, response_text

Marker = Callable[[int], str] | None


def template_messages(
    chat: Chat, *, marker: Marker, native: bool, tool_defs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    counter = iter(range(1_000_000))

    def mark(ttl_s: int | None) -> str:
        return marker(next(counter)) if marker and ttl_s else ""

    names = {p.id: p.name for m in chat.messages for p in m.parts if isinstance(p, ToolCallPart)}
    out: list[dict[str, Any]] = []
    tool_turns: list[bool] = []  # generic: whether out[i] holds tool results
    for message in chat.messages:
        if native:
            out.extend(_native(message.role, message.parts, mark, names))
        else:
            rendered, from_tool = _generic(message.role, message.parts, mark, names)
            _append_generic(out, tool_turns, rendered, from_tool)
    if tool_defs and not native:
        head = preamble(tool_defs)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": head + BLOCK_SEPARATOR + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": head})
    return out


def _native(
    role: str, parts: tuple[Any, ...], mark: Callable[[int | None], str], names: dict[str, str]
) -> Iterator[dict[str, Any]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    call_marks = ""
    had_results = False
    for part in parts:
        if isinstance(part, ToolResultPart):
            had_results = True
            content = part.content + mark(part.ttl_s)
            result = {"role": "tool", "tool_call_id": part.tool_call_id, "content": content}
            if part.tool_call_id in names:
                result["name"] = names[part.tool_call_id]
            yield result
        elif isinstance(part, ToolCallPart):
            function = {"name": part.name, "arguments": json.loads(part.arguments)}
            calls.append({"id": part.id, "type": "function", "function": function})
            call_marks += mark(part.ttl_s)
        else:
            texts.append(part.text + mark(part.ttl_s))
    content = BLOCK_SEPARATOR.join(texts) + call_marks
    if calls:
        yield {"role": role, "content": content, "tool_calls": calls}
    elif texts or not had_results:
        yield {"role": role, "content": content}


def _generic(
    role: str, parts: tuple[Any, ...], mark: Callable[[int | None], str], names: dict[str, str]
) -> tuple[dict[str, str], bool]:
    # Tool results are user-side text; one message's results and its text stay one user message.
    pieces: list[str] = []
    from_tool = role == "tool"
    for part in parts:
        if isinstance(part, ToolResultPart):
            from_tool = True
            text = response_text(part.tool_call_id, names.get(part.tool_call_id), part.content, part.is_error)
        elif isinstance(part, ToolCallPart):
            text = call_text(part.name, json.loads(part.arguments))
        else:
            assert isinstance(part, TextPart)
            text = part.text
        pieces.append(text + mark(part.ttl_s))
    return {"role": "user" if role == "tool" else role, "content": BLOCK_SEPARATOR.join(pieces)}, from_tool


def _append_generic(
    out: list[dict[str, Any]], tool_turns: list[bool], rendered: dict[str, str], from_tool: bool
) -> None:
    if out and out[-1]["role"] == rendered["role"] == "user" and (from_tool or tool_turns[-1]):
        out[-1] = {"role": "user", "content": out[-1]["content"] + BLOCK_SEPARATOR + rendered["content"]}
        tool_turns[-1] = True
        return
    out.append(rendered)
    tool_turns.append(from_tool)
