"""Checks on the tool calls and results in a conversation's history, as each provider makes them.

Anthropic: every tool_use in an assistant message is answered by a tool_result in the
next (user) message, and every tool_result answers a tool_use of the message before.
OpenAI: an assistant message's tool_calls are answered by the `tool` messages right
after it, and every tool message answers one of them. Call ids are unique. Anything
else is a 400, as at the providers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from gateway.prompt import ChatMessage, ToolCallPart, ToolResultPart
from kvgate.errors import InvalidRequestError

Style = Literal["anthropic", "openai"]


def check_pairing(messages: Sequence[ChatMessage], *, style: Style, first_index: int = 0) -> None:
    """Raise InvalidRequestError unless calls and results pair up; `first_index` is messages[0]'s index
    in the request (Anthropic's system prompt is not a message)."""
    seen: set[str] = set()
    open_ids: list[str] = []  # calls awaiting results
    answered: set[str] = set()
    opened_at = 0
    for offset, message in enumerate(messages):
        i = first_index + offset
        if open_ids and not _answers(message, style):
            _unanswered(open_ids, answered, opened_at, style)
            open_ids = []
        for part in message.parts:
            if isinstance(part, ToolResultPart):
                if part.tool_call_id not in open_ids or part.tool_call_id in answered:
                    raise _unexpected_result(i, part.tool_call_id, style)
                answered.add(part.tool_call_id)
        if open_ids and style == "anthropic":
            _unanswered(open_ids, answered, opened_at, style)
            open_ids = []
        calls = [p.id for p in message.parts if isinstance(p, ToolCallPart)]
        for call_id in calls:
            if call_id in seen:
                raise InvalidRequestError(f"messages.{i}: tool call ids must be unique: {call_id!r} repeats")
            seen.add(call_id)
        if calls:
            open_ids, answered, opened_at = calls, set(), i
    if open_ids:
        _unanswered(open_ids, answered, opened_at, style)


def _answers(message: ChatMessage, style: Style) -> bool:
    # The message that may carry results for the open calls.
    return message.role == "user" if style == "anthropic" else message.role == "tool"


def _unanswered(open_ids: list[str], answered: set[str], at: int, style: Style) -> None:
    missing = [c for c in open_ids if c not in answered]
    if not missing:
        return
    ids = ", ".join(missing)
    if style == "anthropic":
        raise InvalidRequestError(
            f"messages.{at}: `tool_use` ids were found without `tool_result` blocks immediately after: {ids}. "
            "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
            param=f"messages.{at}",
        )
    raise InvalidRequestError(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: {ids}",
        param=f"messages.[{at}].role",
    )


def _unexpected_result(i: int, call_id: str, style: Style) -> InvalidRequestError:
    if style == "anthropic":
        return InvalidRequestError(
            f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {call_id}. "
            "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
            param=f"messages.{i}",
        )
    return InvalidRequestError(
        f"messages.[{i}]: messages with role 'tool' must be a response to a preceding message with 'tool_calls' "
        f"(no open call has id {call_id!r})",
        param=f"messages.[{i}].role",
    )
