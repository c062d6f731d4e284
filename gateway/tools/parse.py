"""Tool calls in the model's output: an incremental parser for streams, and the same for a whole text.

A call is `<tool_call>` + a JSON object {"name": <a tool of the request>, "arguments":
{...}} + `</tool_call>` (the generic format, which is also what Hermes/Qwen-style
templates teach). Text that might be the start of `<tool_call>` is held back until it
is known not to be, so no prefix of the tag ever goes out as text. A call goes out
once its closing tag arrives (or the output ends), so that a malformed one (not JSON,
not an object, an unknown tool name, arguments that are not an object) can still go
out as the text it was. Whitespace between text and calls is dropped; an output
without calls comes out exactly as generated. With max_calls, what follows the last
allowed call is dropped.

Small models often leave the tags out (Qwen2.5-Coder-0.5B writes a bare object, or one in
a ```json fence, and one object a line for parallel calls). An output that starts with `{`
or a fence is held until it ends; when the whole of it is such objects, each naming a tool
of the request with arguments that fit that tool's schema (gateway.tools.arguments_fit),
they are calls (up to max_calls). Anything else is read as above: tagged calls and text.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.tools.arguments_fit import arguments_fit
from gateway.tools.choice import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolChoice, function_of

ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id(prefix: str) -> str:
    """A fresh call id as the providers spell them: toolu_... (Anthropic), call_... (OpenAI)."""
    return prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolParsing:
    """What to parse from one request's output: calls of these tools, at most max_calls of them."""

    names: frozenset[str]
    max_calls: int | None = None
    # Each tool's parameters schema: what an untagged call's arguments must fit.
    schemas: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


def parsing_for(definitions: Iterable[dict[str, Any]], choice: ToolChoice) -> ToolParsing | None:
    """What to parse from the output of a request with these tools: nothing without tools or with
    tool_choice none; one call when parallel calls are off or a call is forced (the grammar allows one)."""
    functions = [function_of(d) for d in definitions]
    names = frozenset(f["name"] for f in functions)
    if not names or choice.mode == "none":
        return None
    schemas = {f["name"]: f.get("parameters") or {"type": "object"} for f in functions}
    return ToolParsing(names, 1 if (choice.forced or not choice.parallel) else None, schemas)


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # the arguments object as JSON text

    @property
    def input(self) -> dict[str, Any]:
        return json.loads(self.arguments)


@dataclass(frozen=True)
class TextOut:
    text: str


@dataclass(frozen=True)
class CallOut:
    call: ParsedCall


ParseEvent = TextOut | CallOut


class ToolCallParser:
    """Feed output text as it arrives; each feed returns what can be said for sure so far."""

    def __init__(self, parsing: ToolParsing, *, new_id: Callable[[], str]) -> None:
        self._parsing = parsing
        self._new_id = new_id
        self._buffer = ""  # unconsumed text: held text outside a call, or the body of an open call
        self._in_call = False
        self._done = False  # max_calls reached: the rest is dropped
        self._pending_ws = ""  # trailing whitespace of the text so far, out only if more text follows
        self._after_call = False
        self._bare: bool | None = None  # whether the output may be one untagged call (None: not known yet)
        self.calls = 0

    def feed(self, text: str) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        if self._done:
            return out
        self._buffer += text
        if self._bare is None:
            self._bare = _may_be_bare(self._buffer)
        if self._bare is not False:
            return out  # held: the whole output may be one untagged call
        self._scan(out)
        return out

    def _scan(self, out: list[ParseEvent]) -> None:
        while not self._done:
            if self._in_call:
                end = self._buffer.find(TOOL_CALL_CLOSE)
                if end < 0:
                    break
                body, self._buffer = self._buffer[:end], self._buffer[end + len(TOOL_CALL_CLOSE) :]
                self._in_call = False
                self._end_call(body, closed=True, out=out)
            else:
                start = self._buffer.find(TOOL_CALL_OPEN)
                if start < 0:
                    keep = _partial_tag_len(self._buffer)
                    self._text(self._buffer[: len(self._buffer) - keep], out)
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                self._text(self._buffer[:start], out)
                self._buffer = self._buffer[start + len(TOOL_CALL_OPEN) :]
                self._in_call = True

    def close(self) -> list[ParseEvent]:
        """The output ended: what was held back goes out (an unclosed call counts if its JSON is whole)."""
        out: list[ParseEvent] = []
        if self._bare is not False:
            self._bare = False
            calls = self._bare_calls(self._buffer)
            if calls:
                self._buffer = ""
                calls = calls[: self._parsing.max_calls]
                self.calls += len(calls)
                return [CallOut(call) for call in calls]
            self._scan(out)
        if not self._done:
            if self._in_call:
                self._end_call(self._buffer, closed=False, out=out)
            else:
                self._text(self._buffer, out)
        self._buffer = ""
        if self.calls == 0 and self._pending_ws:
            out.append(TextOut(self._pending_ws))
        self._pending_ws = ""
        return out

    def _end_call(self, body: str, *, closed: bool, out: list[ParseEvent]) -> None:
        call = self._call(body)
        if call is None:
            self._text(TOOL_CALL_OPEN + body + (TOOL_CALL_CLOSE if closed else ""), out)
            return
        self._pending_ws = ""
        self._after_call = True
        self.calls += 1
        out.append(CallOut(call))
        if self._parsing.max_calls is not None and self.calls >= self._parsing.max_calls:
            self._done = True

    def _bare_calls(self, text: str) -> list[ParsedCall] | None:
        """The calls an untagged output is, or None unless all of it is fitting calls."""
        body = text.strip()
        fenced = FENCED.fullmatch(body)
        body = fenced.group(1).strip() if fenced else body
        calls: list[ParsedCall] = []
        decoder = json.JSONDecoder()
        at = 0
        while at < len(body):
            try:
                _, end = decoder.raw_decode(body, at)
            except (ValueError, RecursionError):
                return None
            call = self._call(body[at:end])
            if call is None or not arguments_fit(call.input, self._parsing.schemas.get(call.name, {})):
                return None
            calls.append(call)
            at = end
            while at < len(body) and body[at].isspace():
                at += 1
        return calls or None

    def _call(self, body: str) -> ParsedCall | None:
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict) or value.get("name") not in self._parsing.names:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ParsedCall(self._new_id(), value["name"], json.dumps(arguments, ensure_ascii=False))

    def _text(self, text: str, out: list[ParseEvent]) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body) :]
        if body:
            out.append(TextOut(body))


FENCE = "```"
# One fenced block: ```, an optional language word, the body, ```.
FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)


def _may_be_bare(held: str) -> bool | None:
    """Whether output starting with `held` may be one untagged call: it opens with `{` or a fence
    (None while only whitespace or the start of a fence has arrived)."""
    start = held.lstrip()
    if not start:
        return None
    if start.startswith(("{", FENCE)):
        return True
    return None if FENCE.startswith(start) else False


def _partial_tag_len(text: str) -> int:
    """The length of the longest end of `text` that is a proper prefix of the opening tag."""
    for n in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-n:]):
            return n
    return 0


def merge_text(events: Iterable[ParseEvent]) -> list[ParseEvent]:
    """Adjacent text events as one."""
    merged: list[ParseEvent] = []
    for event in events:
        if isinstance(event, TextOut) and merged and isinstance(merged[-1], TextOut):
            merged[-1] = TextOut(merged[-1].text + event.text)
        else:
            merged.append(event)
    return merged


def parse_output(text: str, parsing: ToolParsing, *, id_prefix: str) -> list[ParseEvent]:
    """A whole output as text and calls, exactly as a stream of it would have gone out."""
    parser = ToolCallParser(parsing, new_id=lambda: new_call_id(id_prefix))
    return merge_text([*parser.feed(text), *parser.close()])
