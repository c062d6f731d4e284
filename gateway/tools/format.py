"""The generic tool format, for models whose chat template does not render tools.

Tools become a preamble at the start of the system message, before the system text,
so the prompt reads tools, system, messages (the order Anthropic caches in):

    # Tools
    <fixed instruction>
    <tools>
    {"name": ..., "description": ..., "parameters": {...}}      one JSON line per tool
    </tools>
    <how to call>

tool_choice adds nothing here (forcing is a grammar, gateway.tools.choice): the preamble
is the same for every tool_choice, so changing it keeps the tools and system cached.

The assistant's calls are `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
(Hermes/Qwen style, which is also what gateway.tools.parse reads back), and tool
results are user-side text `<tool_response>\\n{"tool_call_id": ..., "name": ...,
"content": ...}\\n</tool_response>`. Everything is JSON with fixed key order and no
randomness, so the same request renders to the same text on every turn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.tools.choice import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, function_of

PREAMBLE_HEAD = (
    "# Tools\n\n"
    "You may call one or more functions to help with the user's request. "
    "The available functions, one JSON object per line:\n<tools>\n"
)
PREAMBLE_TAIL = (
    "</tools>\n\n"
    "To call a function, reply with a JSON object holding its name and arguments inside "
    "<tool_call></tool_call> tags, one call per tag:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
    "The results come back in <tool_response></tool_response> tags."
)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def tool_line(definition: dict[str, Any]) -> str:
    function = function_of(definition)
    line = {"name": function["name"], "description": function.get("description") or ""}
    line["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    return _dumps(line)


def preamble(definitions: Sequence[dict[str, Any]]) -> str:
    """The tools part of the system message (no trailing separator)."""
    return PREAMBLE_HEAD + "".join(tool_line(d) + "\n" for d in definitions) + PREAMBLE_TAIL


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One call as the assistant writes it."""
    return f"{TOOL_CALL_OPEN}\n{_dumps({'name': name, 'arguments': arguments})}\n{TOOL_CALL_CLOSE}"


def response_text(tool_call_id: str, name: str | None, content: str, is_error: bool) -> str:
    """One tool result as the user side sends it: JSON, so any content (even a closing tag) stays inside."""
    body: dict[str, Any] = {"tool_call_id": tool_call_id}
    if name is not None:
        body["name"] = name
    body["content"] = content
    if is_error:
        body["is_error"] = True
    return f"<tool_response>\n{_dumps(body)}\n</tool_response>"
