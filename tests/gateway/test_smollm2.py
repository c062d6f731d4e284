"""The gateway on the real SmolLM2-135M-Instruct: real answers, real cache counts, both SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.harness import GatewayServer

pytestmark = pytest.mark.smollm2

SYSTEM = (
    "You are a geography tutor. Answer with the name of the city only, nothing else. "
    "Be accurate; these are quiz answers that students will check against an atlas. " * 5
)


@pytest.fixture(scope="module")
def smol_gateway(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('smol') / 'kvgate.db'}"
    server = GatewayServer(
        model_dir=smollm2_dir,
        database_url=url,
        engine_overrides={"kv_cache_gib": 0.25, "num_threads": None},  # the shipped default
    ).start()
    try:
        yield server
    finally:
        server.stop()


def test_cached_system_prompt_and_a_real_answer(smol_gateway: GatewayServer) -> None:
    key = smol_gateway.new_key()
    client = smol_gateway.anthropic(key)
    body = {
        "model": smol_gateway.model,
        "max_tokens": 8,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "extra_body": {"temperature": 0},
    }
    first = client.messages.create(**body)
    assert "Paris" in first.content[0].text
    assert first.usage.cache_creation_input_tokens > 0 and first.usage.cache_read_input_tokens == 0
    second = client.messages.create(**body)
    assert second.content[0].text == first.content[0].text  # reading the cache changes nothing
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert smol_gateway.anthropic(smol_gateway.new_key()).messages.create(**body).usage.cache_read_input_tokens == 0


def test_streams_match_and_stop_sequences_stop(smol_gateway: GatewayServer) -> None:
    key = smol_gateway.new_key()
    messages = [{"role": "user", "content": "List three colours, separated by commas."}]
    client = smol_gateway.openai(key)
    whole = client.chat.completions.create(model=smol_gateway.model, max_tokens=12, temperature=0, messages=messages)
    chunks = client.chat.completions.create(
        model=smol_gateway.model, max_tokens=12, temperature=0, messages=messages, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    text = whole.choices[0].message.content or ""
    # Stop where the greedy answer first breaks a line (or a word): the same text, cut there.
    stop = "\n" if "\n" in text.strip() else " "
    assert stop in text.strip()
    stopped = smol_gateway.anthropic(key).messages.create(
        model=smol_gateway.model,
        max_tokens=12,
        messages=messages,
        stop_sequences=[stop],
        extra_body={"temperature": 0},
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text.split(stop)[0]
