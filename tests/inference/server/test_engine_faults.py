"""The engine server: bounded numbers are 400s naming the field; a dead engine is a 503 at once, never a hang."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.inference.server.conftest import RunningServer, serve, tiny_settings
from tests.inference.server.helpers import token_prompt


def completion(server: RunningServer, timeout: float = 30, **body: Any) -> httpx.Response:
    payload = {"model": server.engine.model_id, "prompt": token_prompt(12, 5), "max_tokens": 2, **body}
    return httpx.post(f"{server.url}/v1/completions", json=payload, timeout=timeout)


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("seed", 2**64, "seed"),
        ("top_k", 2**31, "top_k"),
        ("max_tokens", 10**12, "max_tokens"),
        ("stop_token_ids", [2**40], "stop_token_ids.0"),
        ("stop", ["x"] * 65, "stop"),
        ("cache_salt", "s" * 257, "cache_salt"),
        ("cache_regions", [{"end": 16, "ttl_s": 2**40}], "cache_regions.0.ttl_s"),
        ("cache_regions", [{"end": 2**40, "ttl_s": 60}], "cache_regions.0.end"),
    ],
)
def test_out_of_range_numbers_are_400_naming_the_field(
    tiny_server: RunningServer, field: str, value: Any, param: str
) -> None:
    response = completion(tiny_server, **{field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["param"] == param, error
    ok = completion(tiny_server, seed=2**63 - 1, temperature=1.0, top_k=2**31 - 1)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


class EngineThreadKilled(BaseException):
    pass


@pytest.fixture
def dying_server(tiny_llama_dir: Path) -> Iterator[tuple[RunningServer, threading.Event]]:
    with serve(tiny_settings(tiny_llama_dir)) as server:
        core = server.engine.core
        assert core is not None
        step, kill = core.step, threading.Event()

        def faulty() -> Any:
            if kill.is_set():
                raise EngineThreadKilled("injected: the engine loop broke")
            return step()

        core.step = faulty  # type: ignore[method-assign]
        yield server, kill


def test_a_dead_engine_is_a_503_at_once_and_health_says_so(
    dying_server: tuple[RunningServer, threading.Event],
) -> None:
    server, kill = dying_server
    assert httpx.get(f"{server.url}/health").status_code == 200
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(completion, server, max_tokens=3000, ignore_eos=True)
        while server.engine.core is None or not server.engine.core.has_unfinished():
            time.sleep(0.01)
        killed_at = time.monotonic()
        kill.set()
        response = waiting.result()
    assert time.monotonic() - killed_at < 5
    assert response.status_code == 503 and "the engine loop broke" in response.json()["error"]["message"]

    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 503 and "EngineThreadKilled" in health.json()["error"]["message"]
    refused = completion(server, timeout=10)
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["type"] == "ServiceUnavailableError"
