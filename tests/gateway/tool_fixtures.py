"""Shared pieces of the tool tests: a tool-capable chat template (Qwen2-style, written here) and sample tools."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# Renders tools natively: definitions in the system turn, assistant tool_calls, role "tool" results.
TOOL_TEMPLATE = """\
{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set rest = messages[1:] %}
{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}
{%- if tools or system %}<|im_start|>system
{{ system }}
{%- if tools %}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Reply with <tool_call>{"name": ..., "arguments": ...}</tool_call> to call one.
{%- endif %}<|im_end|>
{% endif %}
{%- for message in rest %}
{%- if message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Bounded strings and no extra keys: a forced call from the tiny random model must end within max_tokens.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 24}},
    "required": ["zone"],
    "additionalProperties": False,
}


def anthropic_tools(*, cache_last: bool = True) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = [
        {"name": "get_weather", "description": "The current weather in a city.", "input_schema": WEATHER_SCHEMA},
        {"name": "get_time", "description": "The current time in a time zone.", "input_schema": TIME_SCHEMA},
    ]
    if cache_last:
        tools[-1]["cache_control"] = {"type": "ephemeral"}
    return tools


def openai_tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
        }
        for t in anthropic_tools(cache_last=False)
    ]


def model_with_tool_template(model_dir: Path, out: Path) -> Path:
    """A copy of a test model whose tokenizer carries TOOL_TEMPLATE (the weights are linked, not copied)."""
    out.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name == "model.safetensors":
            (out / item.name).symlink_to(item)
        elif item.name != "chat_template.jinja":
            shutil.copy(item, out / item.name)
    (out / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return out
