"""Function tools on /v1/responses: the tool definitions, tool_choice, and the call/output pairing of a conversation.

The Responses API spells a function tool flat ({"type": "function", "name", "parameters",
...}) where Chat Completions nests it under "function"; here it takes the chat form the
renderer expects, and tool_choice becomes the shared gateway.tools.choice.ToolChoice, so
prompts, forcing grammars and output parsing are those of the chat path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError

from gateway.prompt import ToolDef
from gateway.protocols.common import Strict, refuse
from gateway.tools.choice import ToolChoice
from kvgate.errors import InvalidRequestError

CanonicalItem = dict[str, Any]


class FunctionToolParam(Strict):
    type: Literal["function"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


def _function_tool(tool: dict[str, Any], i: int) -> FunctionToolParam:
    if tool.get("type") != "function":
        shown = tool.get("type") if isinstance(tool.get("type"), str) else None
        raise refuse(f"tools.{i}.type", f"tools of type {shown!r} are not supported; only function tools")
    try:
        return FunctionToolParam.model_validate(tool)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise refuse(".".join(map(str, (f"tools.{i}", *first["loc"]))), first["msg"]) from None


def function_tools(tools: Sequence[dict[str, Any]] | None) -> list[FunctionToolParam]:
    """The function tools, checked; 400 for a hosted tool type (web_search, file_search, ...), a malformed
    function tool or a repeated name. (Checked here rather than by the request model, so that a 400 names
    the field as the request spells it: tools.0.name.)"""
    functions: list[FunctionToolParam] = []
    for i, raw in enumerate(tools or ()):
        tool = _function_tool(raw, i)
        if any(f.name == tool.name for f in functions):
            raise refuse(f"tools.{i}.name", f"the function name {tool.name!r} is used by more than one tool")
        functions.append(tool)
    return functions


def tool_defs(tools: Sequence[dict[str, Any]] | None) -> tuple[ToolDef, ...]:
    """Function tools in the chat form chat templates expect."""
    defs = []
    for tool in function_tools(tools):
        function = {"name": tool.name, "description": tool.description or "", "parameters": tool.parameters}
        defs.append(ToolDef({"type": "function", "function": {k: v for k, v in function.items() if v is not None}}))
    return tuple(defs)


def shown_tools(tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The tools as the response object echoes them (OpenAI's FunctionTool shape)."""
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": t.strict,
        }
        for t in function_tools(tools)
    ]


_CHOICE_FORMS = "must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}"


def tool_choice(raw: Any, tools: Sequence[dict[str, Any]] | None, *, parallel: bool | None) -> ToolChoice:
    """tool_choice and parallel_tool_calls as a ToolChoice; 400 for a form kvgate does not do or an unknown name."""
    names = [t.name for t in function_tools(tools)]
    allowed = parallel is not False
    if raw is None or raw == "auto":
        return ToolChoice("auto", None, allowed)
    if raw == "none":
        return ToolChoice("none", None, allowed)
    if raw == "required":
        if not names:
            raise refuse("tool_choice", "'required' needs at least one function in tools")
        return ToolChoice("any", None, allowed)
    if not isinstance(raw, dict):
        raise refuse("tool_choice", _CHOICE_FORMS)
    kind = raw.get("type")
    if kind != "function":
        shown = kind if isinstance(kind, str) else None
        raise refuse("tool_choice", f"a tool_choice of type {shown!r} is not supported; it {_CHOICE_FORMS}")
    name = raw.get("name")
    if not isinstance(name, str) or set(raw) - {"type", "name"}:
        raise refuse("tool_choice", _CHOICE_FORMS)
    if name not in names:
        raise refuse("tool_choice", f"no function named {name!r} in tools")
    return ToolChoice("tool", name, allowed)


def shown_choice(choice: ToolChoice) -> str | dict[str, str]:
    """tool_choice as the response object echoes it."""
    if choice.mode == "tool":
        return {"type": "function", "name": choice.name or ""}
    return "required" if choice.mode == "any" else choice.mode


def check_calls(items: Sequence[CanonicalItem]) -> None:
    """Every function call of the conversation has its output and every output answers an earlier call
    (call ids unique), as OpenAI checks them; a continuation must send the outputs of the calls it follows."""
    calls: list[str] = []
    answered: set[str] = set()
    for item in items:
        call_id = item.get("call_id")
        if item["type"] == "function_call":
            if call_id in calls:
                raise refuse("input", f"Duplicate function call id {call_id!r}.")
            calls.append(call_id)
        elif item["type"] == "function_call_output":
            if call_id not in calls or call_id in answered:
                message = f"No tool call found for function call output with call_id {call_id}."
                raise InvalidRequestError(message, param="input")
            answered.add(call_id)
    missing = [c for c in calls if c not in answered]
    if missing:
        raise InvalidRequestError(f"No tool output found for function call {missing[0]}.", param="input")
