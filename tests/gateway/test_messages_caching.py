"""Prompt caching through the official anthropic SDK: what each call writes and reads, per tenant and TTL."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.protocols.anthropic import MessagesRequest, to_chat
from tests.gateway.harness import GatewayServer

SYSTEM = "You are the support assistant for a bicycle shop. Answer in one short sentence. " * 12
GREEDY = {"temperature": 0}


def system_block(ttl: str = "5m", text: str = SYSTEM) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral", "ttl": ttl}}]


def ask(server: GatewayServer, key: Any, **body: Any) -> Any:
    params: dict[str, Any] = {"model": server.model, "max_tokens": 4, "extra_body": GREEDY}
    params.setdefault("messages", [{"role": "user", "content": "Do you fix brakes?"}])
    params.update(body)
    return server.anthropic(key).messages.create(**params)


def check_invariant(server: GatewayServer, key: Any, message: Any, **body: Any) -> None:
    usage = message.usage
    assert usage.cache_creation.ephemeral_5m_input_tokens + usage.cache_creation.ephemeral_1h_input_tokens == (
        usage.cache_creation_input_tokens
    )
    counted = server.anthropic(key).messages.count_tokens(
        model=server.model, **{k: v for k, v in body.items() if k in ("system", "messages")}
    )
    assert (
        usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens == counted.input_tokens
    )
    assert usage.service_tier == "standard"


def test_a_cached_system_prompt_called_repeatedly(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    body = {"system": system_block(), "messages": [{"role": "user", "content": "Do you fix brakes?"}]}

    first = ask(gateway, key, **body)
    assert first.usage.cache_creation_input_tokens > 0
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == first.usage.cache_creation_input_tokens
    check_invariant(gateway, key, first, **body)
    written = first.usage.cache_creation_input_tokens

    second = ask(gateway, key, **body)
    assert second.usage.cache_read_input_tokens == written
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens == first.usage.input_tokens
    check_invariant(gateway, key, second, **body)

    # Another tenant sending the identical request shares nothing ...
    stranger = gateway.new_key()
    theirs = ask(gateway, stranger, **body)
    assert theirs.usage.cache_read_input_tokens == 0
    assert theirs.usage.cache_creation_input_tokens == written
    # ... while another key of the same tenant shares the tenant's cache.
    colleague = gateway.new_key(key.tenant_id)
    assert ask(gateway, colleague, **body).usage.cache_read_input_tokens == written

    # A third call adds a turn and caches it: the shared system prompt is read, the new part written.
    turns = [
        {"role": "user", "content": "Do you fix brakes?"},
        {"role": "assistant", "content": "Yes, same day."},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "How much does it cost for a road bike with disc brakes?",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    third = ask(gateway, key, system=system_block(), messages=turns)
    assert third.usage.cache_read_input_tokens == written
    assert third.usage.cache_creation_input_tokens > 0
    check_invariant(gateway, key, third, system=system_block(), messages=turns)


def test_entries_expire_after_their_ttl(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    body = {"system": system_block("5m")}
    written = ask(gateway, key, **body).usage.cache_creation_input_tokens
    assert written > 0
    gateway.clock.advance(200)
    within = ask(gateway, key, **body)
    assert within.usage.cache_read_input_tokens == written  # a hit also refreshes the TTL
    gateway.clock.advance(299)
    assert ask(gateway, key, **body).usage.cache_read_input_tokens == written
    gateway.clock.advance(301)
    after = ask(gateway, key, **body)
    assert after.usage.cache_read_input_tokens == 0
    assert after.usage.cache_creation_input_tokens == written


def test_mixed_ttls_split_1h_and_5m_writes(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    question = "Please list every service you offer for mountain bikes, with prices, in a table. " * 3
    body = {
        "system": system_block("1h"),
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": question, "cache_control": {"type": "ephemeral"}}]}
        ],
    }
    request = MessagesRequest.model_validate({"model": gateway.model, "max_tokens": 4, **body})
    rendered = gateway.gateway.renderer.render(to_chat(request))
    system_end = rendered.breakpoints[0].token_end
    block = 16
    first = ask(gateway, key, **body)
    split = first.usage.cache_creation
    # Blocks wholly inside the system prompt are 1h; the rest, up to the message's breakpoint, 5m.
    assert split.ephemeral_1h_input_tokens == system_end // block * block
    assert split.ephemeral_5m_input_tokens > 0
    assert first.usage.cache_creation_input_tokens == split.ephemeral_1h_input_tokens + split.ephemeral_5m_input_tokens
    check_invariant(gateway, key, first, **body)

    # Past 5 minutes only the 1h part is still there: it is read, the 5m part written again.
    gateway.clock.advance(301)
    later = ask(gateway, key, **body)
    assert later.usage.cache_read_input_tokens == split.ephemeral_1h_input_tokens
    assert later.usage.cache_creation.ephemeral_5m_input_tokens == split.ephemeral_5m_input_tokens
    assert later.usage.cache_creation.ephemeral_1h_input_tokens == 0


def test_breakpoints_below_the_minimum_have_no_effect(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    short = ask(gateway, key, system=system_block(text="Be brief."), messages=[{"role": "user", "content": "Hi"}])
    assert short.usage.cache_creation_input_tokens == 0
    assert short.usage.cache_read_input_tokens == 0
    assert short.usage.input_tokens > 0
    again = ask(gateway, key, system=system_block(text="Be brief."), messages=[{"role": "user", "content": "Hi"}])
    assert again.usage.cache_read_input_tokens == 0
    # The same shape above the minimum does cache.
    assert ask(gateway, key, system=system_block()).usage.cache_creation_input_tokens > 0


def test_top_level_cache_control_caches_the_whole_conversation(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    body = {"system": SYSTEM, "cache_control": {"type": "ephemeral"}}
    first = ask(gateway, key, **body)
    assert first.usage.cache_creation_input_tokens > 0
    second = ask(gateway, key, **body)
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens


def test_no_cache_control_writes_nothing(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    plain = ask(gateway, key, system=SYSTEM)
    assert (plain.usage.cache_creation_input_tokens, plain.usage.cache_read_input_tokens) == (0, 0)
    assert ask(gateway, key, system=SYSTEM).usage.cache_read_input_tokens == 0


@pytest.mark.parametrize("salt_pair", [("team-a", "team-b")])
def test_client_cache_salt_partitions_inside_the_tenant(gateway: GatewayServer, salt_pair: tuple[str, str]) -> None:
    key = gateway.new_key()
    a, b = salt_pair

    def salted(salt: str) -> Any:
        return ask(gateway, key, system=system_block(), extra_body={**GREEDY, "cache_salt": salt})

    written = salted(a).usage.cache_creation_input_tokens
    assert salted(a).usage.cache_read_input_tokens == written
    assert salted(b).usage.cache_read_input_tokens == 0
    # Without a client salt the tenant's own partition is a third one.
    assert ask(gateway, key, system=system_block()).usage.cache_read_input_tokens == 0


def test_usage_record_matches_the_response(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    raw = gateway.anthropic(key).messages.with_raw_response.create(
        model=gateway.model, max_tokens=3, system=system_block("1h"), messages=[{"role": "user", "content": "Hi"}]
    )
    message = raw.parse()
    request_id = raw.headers["request-id"]
    row = gateway.usage_record(request_id)
    assert row is not None
    assert row["tenant_id"] == key.tenant_id and row["api_key_id"] == key.key_id
    assert (row["endpoint"], row["model"], row["status"]) == ("messages", gateway.model, "ok")
    assert row["input_tokens"] == message.usage.input_tokens
    assert row["cache_write_1h_tokens"] == message.usage.cache_creation.ephemeral_1h_input_tokens > 0
    assert row["cache_write_5m_tokens"] == message.usage.cache_creation.ephemeral_5m_input_tokens
    assert row["cache_read_tokens"] == message.usage.cache_read_input_tokens
    assert row["output_tokens"] == message.usage.output_tokens == 3
    assert row["latency_ms"] >= 0 and row["ttft_ms"] is not None
    assert gateway.count_usage_records(request_id) == 1
    assert message.id == "msg_" + request_id.removeprefix("req_")
