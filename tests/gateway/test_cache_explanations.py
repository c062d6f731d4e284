"""Cache explanations (issue 28): why a request read what it read, at the engine's precision.

Each reason comes from a real case on the real engine: a TTL lapse on the clock the test moves,
eviction from a small pool, a prompt below the minimum, a prefix past the last breakpoint, another
salt; and each negative is paired with the request that does read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.harness import GatewayServer, Key

EXPLAIN = {"kvgate-cache-explain": "true"}
GREEDY = {"temperature": 0}
SYSTEM = "You are the support assistant for a bicycle shop. Answer in one short sentence. " * 12


def system_block(text: str = SYSTEM, ttl: str = "5m") -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral", "ttl": ttl}}]


def explained(server: GatewayServer, key: Key, **body: Any) -> tuple[Any, dict[str, Any]]:
    params: dict[str, Any] = {"model": server.model, "max_tokens": 2, "extra_body": GREEDY}
    params.setdefault("messages", [{"role": "user", "content": "Do you fix brakes?"}])
    params.update(body)
    raw = server.anthropic(key).messages.with_raw_response.create(extra_headers=EXPLAIN, **params)
    message = raw.parse()
    return raw, message.model_extra["kvgate"]["cache_explanation"]


def test_a_repeat_reads_everything_and_explains_nothing_missed(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    question = [{"type": "text", "text": "Do you fix brakes?", "cache_control": {"type": "ephemeral"}}]
    body = {"system": system_block(), "messages": [{"role": "user", "content": question}]}
    _, first = explained(gateway, key, **body)
    assert first["compared_with_earlier"] is False and first["miss"] is None and first["divergence"] is None
    _, second = explained(gateway, key, **body)
    assert second["read_tokens"] > 0
    assert second["shared_prefix_tokens"] >= second["read_tokens"]
    assert second["miss"] is None
    assert second["divergence"] is None  # the whole prompt was seen before


def test_expired_says_when(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    explained(gateway, key, system=system_block())
    gateway.clock.advance(200)
    _, within = explained(gateway, key, system=system_block())
    assert within["read_tokens"] > 0 and within["miss"] is None
    gateway.clock.advance(301)
    raw, after = explained(gateway, key, system=system_block())
    assert after["read_tokens"] == 0
    assert after["miss"]["reason"] == "expired"
    assert after["miss"]["tokens"] >= within["read_tokens"]
    assert after["miss"]["block"] == 0
    assert after["miss"]["expired_at"].endswith("Z")
    record = gateway.usage_record(raw.headers["request-id"])
    assert record is not None and record["cache_miss_reason"] == "expired"
    assert json.loads(record["cache_explanation"])["miss"]["reason"] == "expired"


def test_below_the_minimum_is_never_written(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    short = system_block("Be brief, and answer like a bicycle mechanic would.")
    explained(gateway, key, system=short)
    _, again = explained(gateway, key, system=short)
    assert again["read_tokens"] == 0
    assert again["miss"] is not None
    assert again["miss"]["reason"] == "never_written" and again["miss"]["cause"] == "below_minimum"
    # The same request, long enough, is written and read.
    explained(gateway, key, system=system_block())
    _, long = explained(gateway, key, system=system_block())
    assert long["read_tokens"] > 0 and long["miss"] is None


def test_no_breakpoint_and_after_the_last_breakpoint(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    plain = [{"type": "text", "text": SYSTEM}]
    explained(gateway, key, system=plain)
    _, again = explained(gateway, key, system=plain)
    assert again["read_tokens"] == 0
    assert again["miss"]["reason"] == "never_written" and again["miss"]["cause"] == "no_breakpoint"

    question = "Please list every service you offer for mountain bikes, with prices, in a table. " * 4
    body = {"system": system_block(), "messages": [{"role": "user", "content": question}]}
    explained(gateway, key, **body)
    _, tail = explained(gateway, key, **body)
    assert tail["read_tokens"] > 0  # the system prompt, up to its breakpoint
    assert tail["miss"]["reason"] == "never_written" and tail["miss"]["cause"] == "after_last_breakpoint"
    # From the first block wholly after the breakpoint (the one it ends inside is never whole).
    assert 0 <= tail["miss"]["block"] * tail["block_size"] - tail["read_tokens"] <= tail["block_size"]


def test_another_salt_is_another_partition(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    explained(gateway, key, system=system_block(), extra_body={**GREEDY, "cache_salt": "alpha"})
    _, same = explained(gateway, key, system=system_block(), extra_body={**GREEDY, "cache_salt": "alpha"})
    assert same["read_tokens"] > 0 and same["miss"] is None
    _, other = explained(gateway, key, system=system_block(), extra_body={**GREEDY, "cache_salt": "beta"})
    assert other["read_tokens"] == 0
    assert other["miss"]["reason"] == "other_partition"
    assert other["miss"]["tokens"] >= same["read_tokens"]


def test_the_divergence_names_its_region(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    turns = [
        {"role": "user", "content": "Do you fix brakes? " * 6},
        {"role": "assistant", "content": "Yes, same day."},
        {"role": "user", "content": "And gears?"},
    ]
    explained(gateway, key, system=system_block(), messages=turns)
    changed = [turns[0], turns[1], {"role": "user", "content": "And wheels, tyres and chains, please?"}]
    _, later = explained(gateway, key, system=system_block(), messages=changed)
    assert later["divergence"]["region"] == "messages[2]"
    assert later["divergence"]["token"] == later["divergence"]["block"] * later["block_size"]
    assert later["read_tokens"] <= later["divergence"]["token"]
    other_system = system_block("You are the support assistant for a ski shop. Answer briefly. " * 12)
    _, system = explained(gateway, key, system=other_system, messages=turns)
    assert system["divergence"]["region"] == "system"


def test_no_explanation_unless_asked_but_always_in_the_record(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    raw = gateway.anthropic(key).messages.with_raw_response.create(
        model=gateway.model,
        max_tokens=2,
        system=system_block(),
        messages=[{"role": "user", "content": "Hi"}],
    )
    assert "kvgate" not in (raw.parse().model_extra or {})
    record = gateway.usage_record(raw.headers["request-id"])
    assert record is not None and json.loads(record["cache_explanation"])["prompt_tokens"] > 0


def test_chat_completions_and_responses_explain_too(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.openai(key)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you fix brakes?"}]
    for salt, expect_read in (("one", False), ("one", True), ("two", False)):
        completion = client.chat.completions.create(
            model=gateway.model,
            messages=messages,
            max_tokens=2,
            extra_headers=EXPLAIN,
            extra_body={"cache_salt": salt, **GREEDY},
        )
        explanation = completion.model_extra["kvgate"]["cache_explanation"]
        assert (explanation["read_tokens"] > 0) is expect_read
    assert explanation["miss"]["reason"] == "other_partition"

    response = client.responses.create(
        model=gateway.model, instructions=SYSTEM, input="Do you fix brakes?", max_output_tokens=2, extra_headers=EXPLAIN
    )
    first = response.model_extra["kvgate"]["cache_explanation"]
    again = client.responses.create(
        model=gateway.model, instructions=SYSTEM, input="Do you fix brakes?", max_output_tokens=2, extra_headers=EXPLAIN
    )
    second = again.model_extra["kvgate"]["cache_explanation"]
    assert first["prompt_tokens"] == second["prompt_tokens"]
    assert second["read_tokens"] > 0 and second["miss"] is None


# -- eviction needs a pool small enough to fill --------------------------------------------------------


@pytest.fixture(scope="module")
def small_pool(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('small-pool') / 'kvgate.db'}"
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=url, engine_overrides={"kv_cache_blocks": 40}).start()
    try:
        yield server
    finally:
        server.stop()


def test_evicted_names_the_tier(small_pool: GatewayServer) -> None:
    key = small_pool.new_key()
    explained(small_pool, key, system=system_block())
    _, hit = explained(small_pool, key, system=system_block())
    assert hit["read_tokens"] > 0 and hit["miss"] is None
    for topic in ("ski", "kayak", "tennis"):
        flood = f"You are the support assistant for a {topic} shop. Answer in one short sentence. " * 12
        explained(small_pool, key, system=system_block(flood))
    _, gone = explained(small_pool, key, system=system_block())
    assert gone["read_tokens"] < hit["read_tokens"]
    assert gone["miss"]["reason"] == "evicted"
    assert gone["miss"]["tier"] == "device"


# -- layout findings -----------------------------------------------------------------------------------

RULES = "Answer in one short sentence. Never promise a repair date. Quote prices in euros. " * 10


def clocked_system(stamp: str) -> list[dict[str, Any]]:
    return system_block(f"Current time: {stamp}\n" + RULES)


def test_a_clock_in_line_one_is_found_and_a_stable_prompt_is_not(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    explained(gateway, key, system=system_block("Current time: none\n" + RULES))
    raw, stable = explained(gateway, key, system=system_block("Current time: none\n" + RULES))
    assert stable["read_tokens"] > 0 and stable["warnings"] == []
    assert "kvgate-cache-warning" not in raw.headers

    other = gateway.new_key()
    explained(gateway, other, system=clocked_system("2026-12-03T10:00:01Z"))
    raw, clocked = explained(gateway, other, system=clocked_system("2026-12-03T10:00:02Z"))
    assert clocked["read_tokens"] < stable["read_tokens"]  # at most the block before the clock
    (finding,) = clocked["warnings"]
    assert finding["type"] == "volatile_prefix"
    assert finding["region"] == "system"
    assert finding["token"] == finding["block"] * clocked["block_size"] < 32
    assert finding["repeated_blocks"] >= 2
    header = raw.headers["kvgate-cache-warning"]
    assert header.startswith("volatile_prefix; region=system; token=")
    record = gateway.usage_record(raw.headers["request-id"])
    assert record is not None and json.loads(record["cache_explanation"])["warnings"] == [finding]


def tool(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"Look up the {name} of a bicycle part.",
        "input_schema": {"type": "object", "properties": {"part": {"type": "string"}}, "required": ["part"]},
        **extra,
    }


def test_reordered_tools_and_tool_key_order_are_found(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    tools = [tool("price"), tool("stock")]
    explained(gateway, key, system=system_block(), tools=tools)
    _, same = explained(gateway, key, system=system_block(), tools=tools)
    assert same["warnings"] == [] and same["read_tokens"] > 0

    raw, swapped = explained(gateway, key, system=system_block(), tools=list(reversed(tools)))
    assert [w["type"] for w in swapped["warnings"]] == ["tools_reordered"]
    assert swapped["warnings"][0]["region"] == "tools[0]"
    assert "tools_reordered" in raw.headers["kvgate-cache-warning"]

    explained(gateway, key, system=system_block(), tools=tools)
    # The same definitions, their schemas' keys in another order (rendered as sent).
    shuffled = [{**t, "input_schema": dict(reversed(list(t["input_schema"].items())))} for t in tools]
    _, keys = explained(gateway, key, system=system_block(), tools=shuffled)
    assert [w["type"] for w in keys["warnings"]] == ["tool_key_order"]
