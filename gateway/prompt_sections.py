"""Where each section of a rendered prompt starts, in tokens: each tool, the system section, each message.

Cache diagnostics report how many tokens two prompts share before they part; the parting is at
the start of the first section that differs, and this finds it in the current prompt, exactly,
whatever the chat template does with the sections. A random marker is put at the start of every
section's content (a tool's name, a message's first part), the chat is rendered once more, and
the markers' positions are mapped to token offsets with the tokenizer's offset mapping
(`PromptRenderer.marker_offsets`). It costs one more render and tokenization, so it runs only for
requests that ask for a comparison.

Starts are not forced into API order: a template may render a section earlier (Qwen's puts the
system text before the tools). A section whose marker the template dropped gets the start of the
next section (in API order) that was found, or the prompt's end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from gateway.cache_fingerprints import system_count
from gateway.prompt import Chat, ChatMessage, ChatPart, PromptRenderer, RenderedPrompt, TextPart, ToolCallPart, ToolDef


@dataclass(frozen=True)
class SectionStarts:
    """Token offsets, in the rendered prompt, where each section's content starts."""

    tools: tuple[int, ...]
    system: int | None  # None: no system section
    messages: tuple[int, ...]  # the messages after the system section
    prompt_tokens: int

    def tool(self, index: int) -> int:
        """Where tools[index] starts; past the last tool, where what follows the tools starts."""
        if index < len(self.tools):
            return self.tools[index]
        return self.system if self.system is not None else self.message(0)

    def message(self, index: int) -> int:
        """Where messages[index] starts; past the last message, the prompt's end."""
        return self.messages[index] if index < len(self.messages) else self.prompt_tokens


def _marked_tool(tool: ToolDef, mark: str) -> ToolDef:
    function = tool.definition.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return tool
    definition: dict[str, Any] = {**tool.definition, "function": {**function, "name": mark + function["name"]}}
    return replace(tool, definition=definition)


def _marked_part(part: ChatPart, mark: str) -> ChatPart:
    if isinstance(part, TextPart):
        return replace(part, text=mark + part.text)
    if isinstance(part, ToolCallPart):
        return replace(part, name=mark + part.name)
    return replace(part, content=mark + part.content)


def _marked_message(message: ChatMessage, mark: str) -> ChatMessage:
    if not message.parts:
        return message
    return ChatMessage(message.role, (_marked_part(message.parts[0], mark), *message.parts[1:]))


def section_starts(renderer: PromptRenderer, chat: Chat, prompt: RenderedPrompt) -> SectionStarts:
    opening = f"<<kvgate-section-{os.urandom(8).hex()}-"

    def mark(i: int) -> str:
        return f"{opening}{i}>>"

    n_tools = len(chat.tools)
    marked = Chat(
        messages=tuple(_marked_message(m, mark(n_tools + k)) for k, m in enumerate(chat.messages)),
        tools=tuple(_marked_tool(t, mark(i)) for i, t in enumerate(chat.tools)),
        tool_choice=chat.tool_choice,
    )
    found = renderer.marker_offsets(marked, opening=opening, plain=prompt.text)
    total = len(prompt.token_ids)
    # Filled from the end: a missing marker takes the start of the next section found.
    starts: list[int] = [0] * (n_tools + len(chat.messages))
    following = total
    for i in range(len(starts) - 1, -1, -1):
        following = found.get(i, following)
        starts[i] = following
    head = system_count(chat)
    message_starts = starts[n_tools:]
    return SectionStarts(
        tools=tuple(starts[:n_tools]),
        system=message_starts[0] if head else None,
        messages=tuple(message_starts[head:]),
        prompt_tokens=total,
    )
