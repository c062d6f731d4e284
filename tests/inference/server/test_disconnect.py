"""A client that leaves stops its request: the engine cancels it instead of decoding on."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from inference.server.streaming import result_unless_disconnected
from tests.inference.server.conftest import RunningServer
from tests.inference.server.helpers import token_prompt
from tests.inference.server.test_metrics import wait_for

ABORTED = "vllm:request_success_total{finished_reason=abort}"
# Tens of seconds of decoding on the tiny model on CPU; where it is faster, the request
# finishes as "length", not "abort", so the test still fails without a cancel.
LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0}


def _body(server: RunningServer, seed: int, **extra: object) -> dict[str, object]:
    return {"model": server.engine.model_id, "prompt": token_prompt(20, seed), **LONG, **extra}


def _assert_cancelled(server: RunningServer, aborted_before: float) -> None:
    samples = wait_for(server, ABORTED, aborted_before + 1)
    assert samples.get(ABORTED, 0) == aborted_before + 1
    assert samples["vllm:num_requests_running"] == 0
    assert samples["kvgate:kv_blocks_used"] == 0


def test_leaving_a_stream_cancels_the_request(tiny_server: RunningServer) -> None:
    before = tiny_server.metrics().get(ABORTED, 0)
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{tiny_server.url}/v1/completions", json=_body(tiny_server, 31, stream=True)) as r,
    ):
        assert r.status_code == 200
        # Keep the iterator: closing it (as a discarded generator expression would) hangs up.
        lines = r.iter_lines()
        first = next(lines)
        assert first.startswith("data: ") and '"text_completion"' in first
        assert tiny_server.metrics()["vllm:num_requests_running"] == 1
    _assert_cancelled(tiny_server, before)


def test_leaving_a_whole_request_cancels_it(tiny_server: RunningServer) -> None:
    before = tiny_server.metrics().get(ABORTED, 0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{tiny_server.url}/v1/completions", json=_body(tiny_server, 32), timeout=1.0)
    _assert_cancelled(tiny_server, before)


class _FakeHandle:
    def __init__(self) -> None:
        self.output: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    async def result(self) -> str:
        return await asyncio.shield(self.output)

    def cancel(self) -> None:
        self.cancelled = True


class _FakeRequest:
    def __init__(self, disconnect: asyncio.Event) -> None:
        self.disconnect = disconnect

    async def receive(self) -> dict[str, str]:
        await self.disconnect.wait()
        return {"type": "http.disconnect"}


async def test_whole_request_returns_the_output_of_a_present_client() -> None:
    handle, gone = _FakeHandle(), asyncio.Event()
    waiting = asyncio.ensure_future(result_unless_disconnected(handle, _FakeRequest(gone)))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    handle.output.set_result("done")
    assert await waiting == "done"
    assert not handle.cancelled


async def test_whole_request_of_a_departed_client_is_cancelled() -> None:
    handle, gone = _FakeHandle(), asyncio.Event()
    waiting = asyncio.ensure_future(result_unless_disconnected(handle, _FakeRequest(gone)))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    gone.set()
    assert await asyncio.wait_for(waiting, timeout=5) is None
    assert handle.cancelled
