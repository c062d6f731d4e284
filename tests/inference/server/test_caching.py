"""Prefix-cache accounting as clients see it: usage.prompt_tokens_details through the server."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.inference.server.conftest import RunningServer
from tests.inference.server.helpers import expected_hit, token_prompt, unique_salt


def _details(client: openai.OpenAI, server: RunningServer, prompt: list[int], **extra: Any) -> dict[str, Any]:
    out = client.completions.create(
        model=server.engine.model_id, prompt=prompt, temperature=0, max_tokens=1, extra_body=extra
    )
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    return out.usage.prompt_tokens_details.model_dump()


@pytest.mark.parametrize("length", [48, 50, 100])
def test_repeat_reads_full_blocks_but_the_last_token(
    tiny_server: RunningServer, client: openai.OpenAI, length: int
) -> None:
    prompt = token_prompt(length, seed=length)
    salt = unique_salt()
    cold = _details(client, tiny_server, prompt, cache_salt=salt)
    warm = _details(client, tiny_server, prompt, cache_salt=salt)
    assert cold["cached_tokens"] == 0
    assert cold["cache_write_tokens"] == expected_hit(length)
    assert cold["cache_write_tokens_by_ttl"] == {"300": expected_hit(length)}
    assert warm["cached_tokens"] == expected_hit(length)
    assert warm["cached_tokens_by_tier"] == {"device": expected_hit(length), "host": 0, "disk": 0, "redis": 0}
    assert warm["cache_write_tokens"] == 0


def test_different_salt_reads_nothing(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    prompt = token_prompt(64, seed=11)
    salt = unique_salt()
    _details(client, tiny_server, prompt, cache_salt=salt)
    same = _details(client, tiny_server, prompt, cache_salt=salt)
    other = _details(client, tiny_server, prompt, cache_salt=unique_salt())
    unsalted = _details(client, tiny_server, prompt)
    assert same["cached_tokens"] > 0
    assert other["cached_tokens"] == 0
    assert unsalted["cached_tokens"] == 0


def test_extending_a_prompt_reads_the_shared_blocks(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    base = token_prompt(40, seed=12)
    salt = unique_salt()
    _details(client, tiny_server, base, cache_salt=salt)
    extended = _details(client, tiny_server, [*base, *token_prompt(30, seed=13)], cache_salt=salt)
    assert extended["cached_tokens"] == 32
    assert extended["cache_write_tokens"] == expected_hit(70) - 32


def test_cache_regions_commit_only_inside_them(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    prompt = token_prompt(80, seed=14)
    salt = unique_salt()
    regions = [{"end": 48, "ttl_s": 3600}, {"end": 64, "ttl_s": 300}]
    cold = _details(client, tiny_server, prompt, cache_salt=salt, cache_regions=regions)
    assert cold["cache_write_tokens_by_ttl"] == {"300": 16, "3600": 48}
    assert cold["cache_write_tokens"] == 64
    warm = _details(client, tiny_server, prompt, cache_salt=salt, cache_regions=regions)
    assert warm["cached_tokens"] == 64

    nothing = _details(client, tiny_server, token_prompt(80, seed=15), cache_salt=salt, cache_regions=[])
    assert nothing["cache_write_tokens"] == 0
