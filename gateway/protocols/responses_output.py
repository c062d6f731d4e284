"""A response's output items (assistant messages and function calls) and the stream events that build them.

One OutputBuilder makes both: fed the output as text and parsed calls (gateway.tools.parse),
it returns the events a stream sends and keeps the items the final response lists, so a
streamed response and a whole one have the same items. Each run of text is a message item,
each call a function_call item, in output order:

    message:       response.output_item.added, response.content_part.added,
                   response.output_text.delta..., response.output_text.done,
                   response.content_part.done, response.output_item.done
    function_call: response.output_item.added (arguments ""), response.function_call_arguments.delta,
                   response.function_call_arguments.done, response.output_item.done
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from gateway.tools.parse import CallOut, ParsedCall, ParseEvent

ItemStatus = Literal["in_progress", "completed", "incomplete"]
Event = tuple[str, dict[str, Any]]  # an event's type and body, numbered when sent


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str  # a JSON object, as text
    status: ItemStatus = "completed"


OutputItem = Annotated[OutputMessage | OutputFunctionCall, Field(discriminator="type")]


def message_id(request_id: str, n: int = 0) -> str:
    """The id of the response's n-th message item (the first keeps the plain form)."""
    base = "msg_" + request_id.removeprefix("req_")
    return base if n == 0 else f"{base}_{n}"


def call_item(call: ParsedCall, status: ItemStatus = "completed") -> OutputFunctionCall:
    # The item id mirrors the call id (call_X -> fc_X), as unique as it is.
    item_id = "fc_" + call.id.removeprefix("call_")
    return OutputFunctionCall(id=item_id, call_id=call.id, name=call.name, arguments=call.arguments, status=status)


class OutputBuilder:
    """Output items from text and calls as they come, with the stream events that announce them."""

    def __init__(self, request_id: str) -> None:
        self._request_id = request_id
        self.items: list[OutputMessage | OutputFunctionCall] = []
        self._text: str | None = None  # the open message's text; None when no message is open
        self._messages = 0

    def open_message(self) -> list[Event]:
        """Open a message item (a reply without tools opens it at once, before any text)."""
        if self._text is not None:
            return []
        self._text = ""
        item = OutputMessage(id=message_id(self._request_id, self._messages), status="in_progress", content=[])
        self._messages += 1
        self.items.append(item)
        return [
            ("response.output_item.added", {"output_index": self._index, "item": _dump(item)}),
            ("response.content_part.added", {**self._where(), "part": _dump(OutputText(text=""))}),
        ]

    def text(self, text: str) -> list[Event]:
        if not text:
            return []
        events = self.open_message()
        self._text = (self._text or "") + text
        return [*events, ("response.output_text.delta", {**self._where(), "delta": text, "logprobs": []})]

    def call(self, call: ParsedCall) -> list[Event]:
        events = self._close_message("completed")
        item = call_item(call)
        self.items.append(item)
        where = {"item_id": item.id, "output_index": self._index}
        added = call_item(ParsedCall(call.id, call.name, ""), "in_progress")
        return [
            *events,
            ("response.output_item.added", {"output_index": self._index, "item": _dump(added)}),
            ("response.function_call_arguments.delta", {**where, "delta": call.arguments}),
            ("response.function_call_arguments.done", {**where, "arguments": call.arguments}),
            ("response.output_item.done", {"output_index": self._index, "item": _dump(item)}),
        ]

    def feed(self, events: Iterable[ParseEvent]) -> list[Event]:
        out: list[Event] = []
        for e in events:
            out += self.call(e.call) if isinstance(e, CallOut) else self.text(e.text)
        return out

    def finish(self, status: ItemStatus) -> list[Event]:
        """The output ended: the open message closes with the response's status (an empty reply is one empty
        message, as OpenAI gives it)."""
        events = [] if self.items else self.open_message()
        return events + self._close_message(status)

    @property
    def calls(self) -> int:
        return sum(isinstance(item, OutputFunctionCall) for item in self.items)

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1].id, "output_index": self._index, "content_index": 0}

    def _close_message(self, status: ItemStatus) -> list[Event]:
        if self._text is None:
            return []
        text, self._text = self._text, None
        item = self.items[-1]
        assert isinstance(item, OutputMessage)
        item.status, item.content = status, [OutputText(text=text)]
        where = self._where()
        return [
            ("response.output_text.done", {**where, "text": text, "logprobs": []}),
            ("response.content_part.done", {**where, "part": _dump(OutputText(text=text))}),
            ("response.output_item.done", {"output_index": self._index, "item": _dump(item)}),
        ]


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")
