"""The SSE chunk sequence, on a fake engine handle: failures and early hang-ups."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from inference.server.outputs import COMPLETION, ResponseContext
from inference.server.streaming import events
from inference.types import RequestOutput, SamplingParams, TokenDelta, Usage


class _Handle:
    def __init__(self, finish_reason: str, texts: list[str]) -> None:
        usage = Usage(prompt_tokens=3, cached_tokens=0, cache_write_tokens=0, completion_tokens=len(texts))
        self.output = RequestOutput(
            request_id="r",
            prompt_token_ids=(1, 2, 3),
            token_ids=tuple(range(len(texts))),
            text="".join(texts),
            finish_reason=finish_reason,  # type: ignore[arg-type]
            usage=usage,
            error="boom" if finish_reason == "error" else None,
        )
        self.texts = texts
        self.cancelled = False

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        for i, text in enumerate(self.texts):
            yield TokenDelta((i,), text)

    async def result(self) -> RequestOutput:
        return self.output

    def cancel(self) -> None:
        self.cancelled = True


CTX = ResponseContext(id="cmpl-1", model="m", params=SamplingParams())


async def _collect(handle: _Handle, include_usage: bool = True) -> list[str]:
    return [chunk.decode() async for chunk in events(handle, COMPLETION, CTX, include_usage)]  # type: ignore[arg-type]


def _data(chunk: str) -> dict:
    assert chunk.startswith("data: ") and chunk.endswith("\n\n")
    return json.loads(chunk.removeprefix("data: "))


async def test_finished_stream_ends_with_usage_then_done() -> None:
    chunks = await _collect(_Handle("length", ["a", "", "b"]))
    assert chunks[-1] == "data: [DONE]\n\n"
    bodies = [_data(c) for c in chunks[:-1]]
    assert [b["choices"][0]["text"] for b in bodies[:2]] == ["a", "b"]  # empty deltas are not sent
    assert bodies[2]["choices"][0]["finish_reason"] == "length"
    assert bodies[3]["choices"] == [] and bodies[3]["usage"]["completion_tokens"] == 3


async def test_engine_failure_is_an_error_chunk() -> None:
    chunks = await _collect(_Handle("error", ["a"]))
    assert chunks[-1] == "data: [DONE]\n\n"
    error = _data(chunks[-2])["error"]
    assert error == {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
    assert not any('finish_reason":"error' in c for c in chunks)


async def test_closing_the_stream_early_cancels_the_request() -> None:
    handle = _Handle("length", ["a", "b", "c"])
    stream = events(handle, COMPLETION, CTX, True)  # type: ignore[arg-type]
    await anext(stream)
    assert not handle.cancelled
    await stream.aclose()
    assert handle.cancelled
