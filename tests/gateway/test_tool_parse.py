"""Tool calls parsed from output text: whole, and streamed split at every boundary."""

from __future__ import annotations

import itertools

import pytest

from gateway.tools.choice import ToolChoice
from gateway.tools.format import TOOL_CALL_OPEN
from gateway.tools.parse import (
    CallOut,
    ParsedCall,
    ParseEvent,
    TextOut,
    ToolCallParser,
    ToolParsing,
    merge_text,
    parse_output,
    parsing_for,
)

TOOLS = ToolParsing(frozenset({"get_weather", "get_time"}))
CALL_1 = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_2 = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
SAMPLE = f"Let me look that up.\n{CALL_1}\n{CALL_2}"


def ids() -> itertools.count[int]:
    return itertools.count(1)


def run(chunks: list[str], parsing: ToolParsing = TOOLS) -> list[ParseEvent]:
    counter = ids()
    parser = ToolCallParser(parsing, new_id=lambda: f"id{next(counter)}")
    events: list[ParseEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.close()


def shape(events: list[ParseEvent]) -> list[tuple[str, ...]]:
    return [
        ("call", e.call.id, e.call.name, e.call.arguments) if isinstance(e, CallOut) else ("text", e.text)
        for e in merge_text(events)
    ]


def test_text_then_two_calls() -> None:
    assert shape(run([SAMPLE])) == [
        ("text", "Let me look that up."),
        ("call", "id1", "get_weather", '{"city": "Paris"}'),
        ("call", "id2", "get_time", '{"zone": "CET"}'),
    ]


UNICODE = 'Météo à Paris ☀\n<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich ☔"}}</tool_call>'


@pytest.mark.parametrize("sample", [SAMPLE, UNICODE, f"{CALL_1} and then some text <tool", "no calls, ends in <tool_c"])
def test_every_split_gives_the_same_result_and_no_tag_prefix_leaks(sample: str) -> None:
    whole = shape(run([sample]))
    for i in range(len(sample) + 1):
        events = run([sample[:i], sample[i:]])
        assert shape(events) == whole, i
        if any(isinstance(e, CallOut) for e in events):
            # Text that went out before a call never ends in a piece of the tag it opened with.
            first_call = next(k for k, e in enumerate(events) if isinstance(e, CallOut))
            for e in events[:first_call]:
                assert isinstance(e, TextOut)
                assert not any(e.text.endswith(TOOL_CALL_OPEN[:n]) for n in range(1, len(TOOL_CALL_OPEN) + 1))
    assert shape(run(list(sample))) == whole  # one character at a time


def test_output_without_calls_comes_out_exactly() -> None:
    text = "Plain text, with <b>tags</b>, a < sign and trailing space \n"
    assert shape(run(list(text))) == [("text", text)]
    # "<tool" is held back until the next chunk shows it opens a call...
    parser = ToolCallParser(TOOLS, new_id=lambda: "id")
    assert parser.feed("abc <tool") == [TextOut("abc")]
    assert parser.feed(CALL_1.removeprefix("<tool")) == [CallOut(ParsedCall("id", "get_weather", '{"city": "Paris"}'))]
    # ...and goes out as text when it does not.
    parser = ToolCallParser(TOOLS, new_id=lambda: "id")
    assert parser.feed("abc <tool") == [TextOut("abc")]
    assert parser.feed("box") == [TextOut(" <toolbox")]


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        '{"name": "unknown_tool", "arguments": {}}',
        '["get_weather"]',
        '{"name": "get_weather", "arguments": [1, 2]}',
        '{"name": "get_weather", "arguments": "not json"}',
    ],
)
def test_malformed_calls_stay_text(body: str) -> None:
    text = f"Before. <tool_call>{body}</tool_call>"
    assert shape(run([text])) == [("text", text)]


def test_arguments_as_a_json_string_and_an_unclosed_final_call_are_accepted() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}'
    assert shape(run([text])) == [("call", "id1", "get_time", '{"zone": "UTC"}')]
    truncated = '<tool_call>{"name": "get_time", "argu'
    assert shape(run([truncated])) == [("text", truncated)]


def test_max_calls_drops_what_follows_the_last_allowed_call() -> None:
    one = ToolParsing(TOOLS.names, max_calls=1)
    assert shape(run([SAMPLE], one)) == [
        ("text", "Let me look that up."),
        ("call", "id1", "get_weather", '{"city": "Paris"}'),
    ]
    assert len(shape(run([SAMPLE]))) == 3


def test_parse_output_ids_and_parsing_for() -> None:
    events = parse_output(SAMPLE, TOOLS, id_prefix="toolu_")
    call_ids = [e.call.id for e in events if isinstance(e, CallOut)]
    assert all(i.startswith("toolu_") and len(i) == 30 for i in call_ids) and len(set(call_ids)) == 2
    definitions = [{"type": "function", "function": {"name": "get_weather"}}]
    assert parsing_for(definitions, ToolChoice("none")) is None
    assert parsing_for([], ToolChoice()) is None
    assert parsing_for(definitions, ToolChoice()) == ToolParsing(frozenset({"get_weather"}))
    assert parsing_for(definitions, ToolChoice("auto", parallel=False)).max_calls == 1  # type: ignore[union-attr]
    assert parsing_for(definitions, ToolChoice("any")).max_calls == 1  # type: ignore[union-attr]


# -- untagged calls: the whole output one JSON object (bare or fenced) ---------------------------

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
    "additionalProperties": False,
}
SCHEMAS = ToolParsing(frozenset({"get_weather"}), schemas={"get_weather": WEATHER})
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize(
    "output",
    [BARE, f"  \n{BARE}\n", f"```json\n{BARE}\n```", f"```\n{BARE}\n```", BARE.replace("arguments", "parameters")],
    ids=["bare", "spaced", "fenced-json", "fenced", "parameters-key"],
)
def test_a_whole_output_that_is_one_fitting_call_is_a_call_at_every_split(output: str) -> None:
    expected = [("call", "id1", "get_weather", '{"city": "Paris"}')]
    assert shape(run([output], SCHEMAS)) == expected
    for cut in range(1, len(output)):
        assert shape(run([output[:cut], output[cut:]], SCHEMAS)) == expected, cut
    assert shape(run(list(output), SCHEMAS)) == expected


@pytest.mark.parametrize(
    "output",
    [
        '{"name": "get_stock", "arguments": {"city": "Paris"}}',  # a tool the request did not offer
        '{"name": "get_weather", "arguments": {"town": "Paris"}}',  # a required argument missing
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}',  # outside the enum
        '{"name": "get_weather", "arguments": {"city": 7}}',  # the wrong type
        f"{BARE} and that is my answer",  # more than the object
        f"Here you go: {BARE}",  # text first
        '{"city": "Paris"}',  # no name
        "{" * 5000 + "}" * 5000,  # nested past the JSON parser's recursion limit
        "```json\nnot json\n```",
    ],
)
def test_an_output_that_is_not_exactly_one_fitting_call_is_text(output: str) -> None:
    assert shape(run([output], SCHEMAS)) == [("text", output.strip())]
    assert shape(run([*output[:300], output[300:]], SCHEMAS)) == [("text", output.strip())]


def test_text_that_does_not_open_like_json_streams_at_once_and_tagged_calls_still_parse() -> None:
    parser = ToolCallParser(SCHEMAS, new_id=lambda: "id1")
    assert shape(parser.feed("The weather ")) == [("text", "The weather")]
    held = ToolCallParser(SCHEMAS, new_id=lambda: "id1")
    assert held.feed("{") == []  # may be a call: held until the output ends
    assert shape(run([f"```\n{CALL_1}\n```"], TOOLS)) == [
        ("text", "```"),
        ("call", "id1", "get_weather", '{"city": "Paris"}'),
        ("text", "```"),
    ]


def test_untagged_calls_one_a_line_are_parallel_calls_up_to_max_calls() -> None:
    second = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    both = [("call", "id1", "get_weather", '{"city": "Paris"}'), ("call", "id2", "get_weather", '{"city": "Rome"}')]
    assert shape(run([f"{BARE}\n{second}"], SCHEMAS)) == both
    assert shape(run([f"```json\n{BARE}\n{second}\n```"], SCHEMAS)) == both
    one = ToolParsing(SCHEMAS.names, 1, SCHEMAS.schemas)
    assert shape(run([f"{BARE}\n{second}"], one)) == both[:1]
    # One line that is not a fitting call makes the whole output text.
    mixed = f'{BARE}\n{{"name": "get_weather", "arguments": {{"town": "Rome"}}}}'
    assert shape(run([mixed], SCHEMAS)) == [("text", mixed)]
