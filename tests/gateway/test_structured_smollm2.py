"""Structured output on the real SmolLM2-135M-Instruct: `parse` returns an object that validates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from tests.gateway.harness import GatewayServer

pytestmark = pytest.mark.smollm2


class City(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)
    continent: Literal["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]


@pytest.fixture(scope="module")
def smol_gateway(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('smol-structured') / 'kvgate.db'}"
    server = GatewayServer(model_dir=smollm2_dir, database_url=url, engine_overrides={"kv_cache_gib": 0.25}).start()
    try:
        yield server
    finally:
        server.stop()


def test_parse_and_json_object_on_the_real_model(smol_gateway: GatewayServer) -> None:
    client = smol_gateway.openai(smol_gateway.new_key())
    messages = [{"role": "user", "content": "What is the capital of France? Answer as JSON."}]
    completion = client.chat.completions.parse(
        model=smol_gateway.model, messages=messages, response_format=City, max_tokens=48, temperature=0
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, City)
    assert choice.message.parsed.continent == "Europe"
    assert "Paris" in choice.message.parsed.city
    obj = client.chat.completions.create(
        model=smol_gateway.model,
        messages=messages,
        response_format={"type": "json_object"},
        max_tokens=48,
        temperature=0,
    )
    assert obj.choices[0].finish_reason == "stop", obj.choices[0].message.content
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
