"""tool_choice, as both APIs express it, and the grammar that forces a call.

Forcing (Anthropic "any"/"tool", OpenAI "required"/a named function) is constrained
decoding: the output must be exactly one call in the generic format, `<tool_call>`,
a JSON object {"name": <one of the allowed tools>, "arguments": <its input schema>},
`</tool_call>`. The grammar is llguidance's Lark dialect with `%json` for the schema.

The tags follow the tokenizer: where the vocabulary holds `<tool_call>` as one added
token (Qwen's 151657), the grammar names that token (`<[151657]>`), because llguidance
matches added tokens as tokens, never as the text they decode to; elsewhere the tags are
text. Forcing is grammar alone: no instruction enters the prompt, so the tools and the
system text render the same for every tool_choice and stay cached across a change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inference.grammar import lark_json
from inference.types import StructuredOutput

ChoiceMode = Literal["auto", "none", "any", "tool"]


@dataclass(frozen=True)
class ToolChoice:
    """What the model may or must do with the tools: mode, the named tool (mode "tool"), and
    whether it may make more than one call in a turn."""

    mode: ChoiceMode = "auto"
    name: str | None = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.mode in ("any", "tool")


AUTO = ToolChoice()


def function_of(definition: dict[str, Any]) -> dict[str, Any]:
    """The function object of an OpenAI-style tool definition."""
    return definition.get("function", definition)


DEFINITION_KEYS = ("$defs", "definitions")
ARGUMENTS_POINTER = "#/properties/arguments"


def call_schema(function: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one call's object: the tool's name as a constant, its parameters as arguments.

    The parameters move one level down, so what their `$ref`s point at must move with them:
    their `$defs` (what Pydantic emits for nested models) go to the call schema's root, where
    `#/$defs/...` still finds them, and any other local pointer (`#`, `#/properties/...`) is
    rewritten to start at the arguments.
    """
    parameters = function.get("parameters") or {"type": "object"}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    if not isinstance(parameters, dict) or not _has_local_refs(parameters):
        return schema
    arguments = {k: v for k, v in parameters.items() if k not in DEFINITION_KEYS}
    for key in DEFINITION_KEYS:
        if isinstance(parameters.get(key), dict):
            schema[key] = _rebased(parameters[key])
    schema["properties"]["arguments"] = _rebased(arguments)
    return schema


def _has_local_refs(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _rebased(value: Any) -> Any:
    """A copy of a schema whose local `$ref`s point where they did before the parameters moved."""
    if isinstance(value, list):
        return [_rebased(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {key: _rebased(item) for key, item in value.items()}
    ref = value.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        pointer = ref[1:]
        if not any(pointer == f"/{key}" or pointer.startswith(f"/{key}/") for key in DEFINITION_KEYS):
            out["$ref"] = ARGUMENTS_POINTER + pointer
    return out


TokenOf = Callable[[str], int | None]
"""The id of the added token a text is, or None where the vocabulary spells it in ordinary tokens."""

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def no_added_tokens(_text: str) -> int | None:
    return None


def tag_term(tag: str, token_of: TokenOf) -> str:
    """A tag as a grammar term: the token where the vocabulary has it as one, else the text."""
    token = token_of(tag)
    return f"<[{token}]>" if token is not None else json.dumps(tag)


def forcing_grammar(
    definitions: Sequence[dict[str, Any]], choice: ToolChoice, token_of: TokenOf = no_added_tokens
) -> StructuredOutput | None:
    """The grammar that forces one call of an allowed tool, or None when nothing is forced."""
    if not choice.forced:
        return None
    functions = [function_of(d) for d in definitions]
    if choice.mode == "tool":
        functions = [f for f in functions if f["name"] == choice.name]
    opening, closing = tag_term(TOOL_CALL_OPEN, token_of), tag_term(TOOL_CALL_CLOSE, token_of)
    rules = [f'start: {opening} "\\n" call "\\n" {closing}']
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(functions))))
    for i, function in enumerate(functions):
        # Compact JSON (lark_json): with free whitespace a small model can loop on blanks.
        rules.append(f"call_{i}: {lark_json(call_schema(function))}")
    return StructuredOutput("grammar", "\n".join(rules) + "\n")
