"""The real SmolLM2-135M-Instruct behind the server: a greedy answer that knows its geography."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inference.settings import EngineSettings
from tests.inference.server.conftest import RunningServer, serve

pytestmark = pytest.mark.smollm2

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2_server(smollm2_dir: Path) -> Iterator[RunningServer]:
    with serve(EngineSettings(kv_cache_gib=0.25)) as server:
        yield server


def test_capital_of_france_is_paris(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    model = smollm2_server.engine.model_id
    out = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24)
    answer = out.choices[0].message.content
    assert answer is not None and "Paris" in answer
    assert "Berlin" not in answer

    # Streamed and repeated: the same greedy answer, now over a cached prompt prefix.
    stream = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // 16 * 16 > 0
