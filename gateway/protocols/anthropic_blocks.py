"""An Anthropic message's content: blocks from output text, for the message body and for the stream.

A text block opens with the first text, so an empty reply has no block (content: [],
as at Anthropic, where an empty text block sent back in a later request is a 400).
With tools, the text goes through gateway.tools.parse: text blocks open as text
arrives, and each parsed call becomes a tool_use block (content_block_start with
empty input, one input_json_delta with the arguments, content_block_stop).
"""

from __future__ import annotations

from typing import Any

from gateway.protocols.anthropic import TextContent, ToolUseContent
from gateway.sse import event
from gateway.tools.parse import CallOut, ParseEvent, ToolCallParser, ToolParsing, new_call_id, parse_output

ID_PREFIX = "toolu_"
PING = event("ping", {"type": "ping"})


def content_of(text: str, tools: ToolParsing | None) -> tuple[list[TextContent | ToolUseContent], bool]:
    """The body's content blocks, and whether any is a tool call."""
    if tools is None:
        return ([TextContent(text=text)] if text else []), False
    events = parse_output(text, tools, id_prefix=ID_PREFIX)
    blocks: list[TextContent | ToolUseContent] = [
        ToolUseContent(id=e.call.id, name=e.call.name, input=e.call.input)
        if isinstance(e, CallOut)
        else TextContent(text=e.text)
        for e in events
    ]
    calls = any(isinstance(e, CallOut) for e in events)
    return [b for b in blocks if not isinstance(b, TextContent) or b.text], calls


class BlockStream:
    """The content-block events of a streamed message: open(), feed() per delta, close() at the end."""

    def __init__(self, tools: ToolParsing | None) -> None:
        self._parser = ToolCallParser(tools, new_id=lambda: new_call_id(ID_PREFIX)) if tools else None
        self._index = -1
        self._text_open = False

    @property
    def saw_calls(self) -> bool:
        return self._parser is not None and self._parser.calls > 0

    def feed(self, text: str) -> list[bytes]:
        if self._parser is None:
            return self._text(text) if text else []
        return self._events(self._parser.feed(text))

    def close(self) -> list[bytes]:
        out = self._events(self._parser.close()) if self._parser else []
        if self._text_open:
            out.append(self._stop())
            self._text_open = False
        return out

    def _events(self, events: list[ParseEvent]) -> list[bytes]:
        out: list[bytes] = []
        for e in events:
            if isinstance(e, CallOut):
                if self._text_open:
                    out.append(self._stop())
                    self._text_open = False
                block = {"type": "tool_use", "id": e.call.id, "name": e.call.name, "input": {}}
                out += self._start(block)
                delta = {"type": "input_json_delta", "partial_json": e.call.arguments}
                out.append(self._delta(delta))
                out.append(self._stop())
            elif e.text:
                out += self._text(e.text)
        return out

    def _text(self, text: str) -> list[bytes]:
        out = []
        if not self._text_open:
            out += self._start({"type": "text", "text": ""})
            self._text_open = True
        out.append(self._text_delta(text))
        return out

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        self._index += 1
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        # The first block is followed by a ping, where Anthropic's streams have theirs.
        return [event("content_block_start", start), *([PING] if self._index == 0 else [])]

    def _text_delta(self, text: str) -> bytes:
        return self._delta({"type": "text_delta", "text": text})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _stop(self) -> bytes:
        return event("content_block_stop", {"type": "content_block_stop", "index": self._index})
