"""Render a chat with the model's template and locate cache breakpoints as token offsets.

Both APIs reduce a request to a Chat: messages of text blocks, tool calls and tool
results, optional tools with a tool_choice, and the blocks that carry a cache
breakpoint. Tools render through the template when it supports them and in the
generic tool format otherwise (gateway.tools.messages). The rendered text is what the model sees; a
breakpoint's offset is where its block's text ends in that text, converted to a
token count through the tokenizer's offset mapping.

Block ends are found with markers: a random, unguessable string is appended to each
breakpoint block, the chat is rendered again, and the markers' positions (minus the
markers before them) are the block ends. If the template transforms the text so
that the marked render, stripped of markers, differs from the plain one, an offset
falls back to where the two renders diverge, which is never past the block's end:
caching less is safe, caching a prefix the block does not own is not.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter
from typing import Any

from jinja2 import TemplateError

from gateway.prompt_bounds import NO_BOUNDS, PromptBounds
from gateway.tools.choice import AUTO, ToolChoice
from kvgate.errors import InvalidRequestError, PromptTooLongError

# Text blocks of one message are joined like paragraphs.
BLOCK_SEPARATOR = "\n\n"

ApplyTemplate = Callable[..., str]


@dataclass(frozen=True)
class TextPart:
    text: str
    ttl_s: int | None = None  # a cache breakpoint at the end of this block, if set


@dataclass(frozen=True)
class ToolCallPart:
    """A tool call the assistant made earlier in the conversation (Anthropic tool_use, OpenAI tool_calls)."""

    id: str
    name: str
    arguments: str  # the call's input as JSON text
    ttl_s: int | None = None


@dataclass(frozen=True)
class ToolResultPart:
    """The result of an earlier tool call, sent back by the client (Anthropic tool_result, OpenAI tool message)."""

    tool_call_id: str
    content: str
    is_error: bool = False
    ttl_s: int | None = None


ChatPart = TextPart | ToolCallPart | ToolResultPart


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system", "user", "assistant" or "tool"
    parts: tuple[ChatPart, ...]


@dataclass(frozen=True)
class ToolDef:
    definition: dict[str, Any]  # the OpenAI-style function schema chat templates expect
    ttl_s: int | None = None


@dataclass(frozen=True)
class Chat:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolDef, ...] = ()
    tool_choice: ToolChoice = AUTO

    @property
    def has_breakpoints(self) -> bool:
        return any(t.ttl_s for t in self.tools) or any(p.ttl_s for m in self.messages for p in m.parts)


@dataclass(frozen=True)
class Breakpoint:
    token_end: int
    ttl_s: int


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    token_ids: list[int]
    breakpoints: list[Breakpoint] = field(default_factory=list)  # in request order (tools, system, messages)


class PromptRenderer:
    """Renders Chats for one model: its chat template and its tokenizer.

    With bounds, a rendered text too long to fit max_prompt_tokens is refused before
    it is tokenized (see gateway.prompt_bounds).
    """

    def __init__(
        self,
        *,
        apply_chat_template: ApplyTemplate,
        tokenizer: Any,
        bounds: PromptBounds = NO_BOUNDS,
        max_prompt_tokens: int | None = None,
    ) -> None:
        self._apply = apply_chat_template
        self._tokenizer = tokenizer
        self._tools_supported: bool | None = None
        self._added: dict[str, int] | None = None
        self.bounds = bounds
        self._max_prompt_tokens = max_prompt_tokens
        # The Rust tokenizer of a fast (tokenizers-backed) tokenizer; see _encode.
        self._backend: Any = (
            getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        )

    def supports_tools(self) -> bool:
        if self._tools_supported is None:
            probe = [{"role": "user", "content": "hi"}]
            tool = _dummy_tool("kvgate_probe")
            self._tools_supported = self._apply(probe, tools=[tool]) != self._apply(probe)
        return self._tools_supported

    def added_token(self, text: str) -> int | None:
        """The id of the added token `text` is (Qwen's `<tool_call>`), or None where it is ordinary text."""
        if self._added is None:
            self._added = dict(getattr(self._tokenizer, "get_added_vocab", dict)())
        return self._added.get(text)

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text, offsets=False)[0])

    def _encode(self, text: str, *, offsets: bool) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids (and character offsets) of `text` without special tokens, as `tokenizer(text)` gives them.

        A fast tokenizer's Rust backend is called directly when its settings are those the
        call would set (no truncation, no padding, special tokens as the tokenizer's
        split_special_tokens says): the transformers wrapper around it cost as much again
        as the tokenization itself (about 0.4 ms of 1 ms for a 220-token prompt).
        """
        backend = self._backend
        if (
            backend is not None
            and backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens == bool(getattr(self._tokenizer, "split_special_tokens", False))
        ):
            encoding = backend.encode(text, add_special_tokens=False)
            return encoding.ids, (encoding.offsets if offsets else [])
        result = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets)
        return list(result["input_ids"]), (list(result["offset_mapping"]) if offsets else [])

    def render_text(self, text: str) -> RenderedPrompt:
        """A raw prompt, without the chat template (legacy completions); special tokens as the tokenizer adds them."""
        self._check_length(text)
        return RenderedPrompt(text=text, token_ids=list(self._tokenizer(text)["input_ids"]))

    def render(self, chat: Chat) -> RenderedPrompt:
        if not chat.has_breakpoints:
            text = self._render_text(chat, marker=None)
            self._check_length(text)
            return RenderedPrompt(text=text, token_ids=self._encode(text, offsets=False)[0])

        plain = self._render_text(chat, marker=None)
        self._check_length(plain)
        char_ends: list[tuple[int, int]] = [
            (self._tool_end(chat, i, plain), tool.ttl_s) for i, tool in enumerate(chat.tools) if tool.ttl_s
        ]
        char_ends += self._block_ends(chat, plain)
        ids, offsets = self._encode(plain, offsets=True)
        ends = _running_max_ends(offsets)
        breakpoints = [Breakpoint(token_end=bisect_right(ends, c), ttl_s=ttl) for c, ttl in char_ends]
        return RenderedPrompt(text=plain, token_ids=ids, breakpoints=breakpoints)

    def marker_offsets(self, marked: Chat, *, opening: str, plain: str) -> dict[int, int]:
        """Where the markers (`<opening><i>>>`) a caller put into `marked`, a copy of the chat that renders
        to `plain`, stand in `plain`, in tokens (those wholly before the marker); clipped to where the
        renders part if the template changed the text (gateway.prompt_sections)."""
        stripped, positions = _strip_markers(self._render_text(marked, marker=None), opening)
        safe = len(plain) if stripped == plain else _common_prefix_len(stripped, plain)
        ends = _running_max_ends(self._encode(plain, offsets=True)[1])
        return {i: bisect_right(ends, min(c, safe)) for i, c in positions.items()}

    def _check_length(self, text: str) -> None:
        limit = self.bounds.max_chars
        if limit is not None and len(text) > limit and self._max_prompt_tokens is not None:
            raise PromptTooLongError(
                f"prompt is too long: {len(text)} characters cannot fit in {self._max_prompt_tokens} tokens "
                f"(no token of this model holds more than {self.bounds.chars_per_token} characters)"
            )

    def _render_text(
        self, chat: Chat, *, marker: Callable[[int], str] | None, tools: Sequence[Any] | None = None
    ) -> str:
        # Imported here: gateway.tools.messages builds on this module's Chat types.
        from gateway.tools.messages import template_messages

        tool_defs = [t.definition for t in chat.tools] if tools is None else list(tools)
        has_tool_parts = any(not isinstance(p, TextPart) for m in chat.messages for p in m.parts)
        native = bool(tool_defs or has_tool_parts) and self.supports_tools()
        rendered = template_messages(chat, marker=marker, native=native, tool_defs=tool_defs)
        # A final assistant message is a prefill: the model continues it, so it follows
        # the generation prompt verbatim instead of being closed as a finished turn.
        prefill = ""
        if rendered and rendered[-1]["role"] == "assistant" and "tool_calls" not in rendered[-1]:
            prefill = rendered.pop()["content"]
        if not rendered:
            raise InvalidRequestError("messages: a final assistant message needs a user message before it")
        try:
            text = self._apply(rendered, tools=(tool_defs or None) if native else None)
        except (ValueError, TypeError, TemplateError) as exc:
            # Templates raise on conversations they cannot express (e.g. roles that do not alternate).
            raise InvalidRequestError(f"messages: the model's chat template refused this conversation: {exc}") from exc
        return text + prefill

    def _block_ends(self, chat: Chat, plain: str) -> list[tuple[int, int]]:
        ttls = [p.ttl_s for m in chat.messages for p in m.parts if p.ttl_s]
        if not ttls:
            return []
        opening = f"<<kvgate-bp-{os.urandom(8).hex()}-"
        marked = self._render_text(chat, marker=lambda i: f"{opening}{i}>>")
        stripped, positions = _strip_markers(marked, opening)
        safe = len(plain) if stripped == plain else _common_prefix_len(stripped, plain)
        # A template that dropped a marker dropped the block: nothing of it can be cached.
        return [(min(positions.get(i, 0), safe), ttl) for i, ttl in enumerate(ttls)]

    def _tool_end(self, chat: Chat, index: int, plain: str) -> int:
        # Where tool `index` ends: render the tools up to it with and without one more
        # tool after it; the renders agree exactly up to the end of tool `index`.
        head = [t.definition for t in chat.tools[: index + 1]]
        without_next = self._render_text(chat, marker=None, tools=head)
        with_next = self._render_text(chat, marker=None, tools=[*head, _dummy_tool("kvgate_end_probe")])
        end = _common_prefix_len(without_next, with_next)
        if index + 1 < len(chat.tools):
            end = min(end, _common_prefix_len(without_next, plain))
        return end


def _dummy_tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": "", "parameters": {"type": "object", "properties": {}}},
    }


def _common_prefix_len(a: str, b: str) -> int:
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    low, high = 0, limit  # invariant: a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def _strip_markers(marked: str, opening: str) -> tuple[str, dict[int, int]]:
    """`marked` without its markers (`<opening><index>>>`), and where each index's first marker was in the result.

    Plain string search: a pattern compiled per request (the opening holds a random nonce)
    cost more than the rest of the scan.
    """
    pieces: list[str] = []
    positions: dict[int, int] = {}
    kept = 0  # characters of `marked` kept so far
    copied = 0  # where the next piece of `marked` to keep starts
    search = 0
    while (start := marked.find(opening, search)) != -1:
        digits_start = start + len(opening)
        close = marked.find(">>", digits_start)
        digits = marked[digits_start:close] if close != -1 else ""
        if not (digits.isascii() and digits.isdigit()):
            search = start + 1
            continue
        pieces.append(marked[copied:start])
        kept += start - copied
        positions.setdefault(int(digits), kept)
        copied = search = close + 2
    pieces.append(marked[copied:])
    return "".join(pieces), positions


def _running_max_ends(offsets: Sequence[tuple[int, int]]) -> list[int]:
    # Token i counts as inside a prefix of c characters when every character it covers
    # is; running max keeps the sequence sorted even for zero-width special tokens.
    return list(accumulate(map(itemgetter(1), offsets), max, initial=0))[1:]
