"""Every error reaches the official SDKs as its own exception class, in the API's own shape."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.gateway.harness import GatewayServer

MESSAGES = [{"role": "user", "content": "Hello"}]


def create(server: GatewayServer, key: Any, **body: Any) -> Any:
    params: dict[str, Any] = {"model": server.model, "max_tokens": 2, "messages": MESSAGES, **body}
    return server.anthropic(key).messages.create(**params)


def complete(server: GatewayServer, key: Any, **body: Any) -> Any:
    params: dict[str, Any] = {"model": server.model, "max_tokens": 2, "messages": MESSAGES, **body}
    return server.openai(key).chat.completions.create(**params)


def anthropic_error(exc: anthropic.APIStatusError, error_type: str) -> str:
    body = exc.response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    assert body["request_id"] == exc.response.headers["request-id"] == exc.request_id
    return body["error"]["message"]


def openai_error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert exc.response.headers["request-id"].startswith("req_")
    return body["error"]


def cc(ttl: str | None = None) -> dict[str, Any]:
    return {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"system": [{"type": "text", "text": t, "cache_control": cc()} for t in "abcde"]}, "Found 5"),
        (
            {
                "system": [
                    {"type": "text", "text": "a", "cache_control": cc("5m")},
                    {"type": "text", "text": "b", "cache_control": cc("1h")},
                ]
            },
            "'1h' must not come after",
        ),
        ({"system": [{"type": "text", "text": "a", "cache_control": cc("10m")}]}, "ttl"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
            "'image' are not supported",
        ),
        (
            {
                "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "climate"},
            },
            "no tool named 'climate'",
        ),
        ({"messages": []}, "messages"),
        ({"extra_body": {"temperature": 3}}, "temperature"),
        ({"extra_body": {"cache_salt": ""}}, "cache_salt"),
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, "prompt is too long"),
    ],
)
def test_anthropic_bad_requests(gateway: GatewayServer, body: dict[str, Any], needle: str) -> None:
    key = gateway.new_key()
    with pytest.raises(anthropic.BadRequestError) as raised:
        create(gateway, key, **body)
    assert needle in anthropic_error(raised.value, "invalid_request_error")
    create(gateway, key)  # the same key, a good request: fine


def test_anthropic_malformed_bodies(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    url = f"{gateway.base_url}/v1/messages"
    headers = {"x-api-key": key.key, "content-type": "application/json"}
    missing = httpx.post(url, json={"model": gateway.model, "messages": MESSAGES}, headers=headers)
    assert missing.status_code == 400 and "max_tokens: Field required" in missing.json()["error"]["message"]
    garbage = httpx.post(url, content=b"{not json", headers=headers)
    assert garbage.status_code == 400 and "not valid JSON" in garbage.json()["error"]["message"]
    assert httpx.post(url, json=[1, 2], headers=headers).status_code == 400
    assert httpx.get(url, headers=headers).status_code == 405


def test_authentication_and_permission(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    for bad in ("", "kvg-" + "x" * 43, "sk-ant-something"):
        with pytest.raises(anthropic.AuthenticationError) as raised:
            create(gateway, bad or "missing")
        anthropic_error(raised.value, "authentication_error")
        with pytest.raises(openai.AuthenticationError) as refused:
            complete(gateway, bad or "missing")
        assert openai_error(refused.value)["code"] == "invalid_api_key"
    no_key = httpx.post(f"{gateway.base_url}/v1/messages", json={})
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"

    create(gateway, key)  # valid: works
    expired = gateway.new_key(key.tenant_id, expires_at=(datetime.now(UTC) - timedelta(minutes=1)).isoformat())
    with pytest.raises(anthropic.AuthenticationError, match="expired"):
        create(gateway, expired)
    gateway.admin.post(f"/admin/v1/keys/{key.key_id}/revoke").raise_for_status()
    with pytest.raises(anthropic.AuthenticationError, match="revoked"):
        create(gateway, key)

    other = gateway.new_key()
    create(gateway, other)
    gateway.admin.post(f"/admin/v1/tenants/{other.tenant_id}/suspend").raise_for_status()
    with pytest.raises(anthropic.PermissionDeniedError) as raised:
        create(gateway, other)
    anthropic_error(raised.value, "permission_error")
    with pytest.raises(openai.PermissionDeniedError):
        complete(gateway, other)


def test_not_found(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    with pytest.raises(anthropic.NotFoundError) as raised:
        create(gateway, key, model="claude-opus-9")
    assert anthropic_error(raised.value, "not_found_error") == "model: claude-opus-9"
    with pytest.raises(openai.NotFoundError) as refused:
        complete(gateway, key, model="gpt-9")
    assert openai_error(refused.value)["code"] == "model_not_found"
    missing = httpx.get(f"{gateway.base_url}/v1/nothing-here", headers={"anthropic-version": "2023-06-01"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_request_too_large(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    huge = "x" * (gateway.settings.max_request_bytes + 1)
    with pytest.raises(anthropic.ContentTooLargeError) as raised:
        create(gateway, key, messages=[{"role": "user", "content": huge}])
    anthropic_error(raised.value, "request_too_large")
    with pytest.raises(openai.APIStatusError) as refused:
        complete(gateway, key, messages=[{"role": "user", "content": huge}])
    assert refused.value.status_code == 413
    openai_error(refused.value)


def test_rate_limited_requests_get_429_with_headers(gateway: GatewayServer) -> None:
    key = gateway.new_key(requests_per_minute=2)
    raw = gateway.anthropic(key).messages.with_raw_response.create(model=gateway.model, max_tokens=2, messages=MESSAGES)
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "2"
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "1"
    ran = create(gateway, key)
    with pytest.raises(anthropic.RateLimitError) as raised:
        create(gateway, key)
    anthropic_error(raised.value, "rate_limit_error")
    # The refusal is a usage record of its own (gateway/refusals.py), next to the request that ran.
    refusal = gateway.usage_record(raised.value.request_id or "")
    assert refusal is not None and refusal["status"] == "refused" and refusal["refusal_reason"] == "rate_limit"
    assert refusal["endpoint"] == "messages" and refusal["refusal_reserve_pico"] is None
    assert refusal["input_tokens"] == refusal["output_tokens"] == 0 and refusal["tenant_id"] == key.tenant_id
    ran_record = gateway.usage_record(ran._request_id or "")
    assert ran_record is not None and ran_record["status"] == "ok" and ran_record["refusal_reason"] is None
    headers = raised.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 30
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    with pytest.raises(openai.RateLimitError) as refused:
        complete(gateway, key)
    assert openai_error(refused.value)["code"] == "rate_limit_exceeded"
    # Another key of the same tenant has its own bucket.
    create(gateway, gateway.new_key(key.tenant_id, requests_per_minute=2))


def test_cache_reads_do_not_count_toward_the_input_token_limit(gateway: GatewayServer) -> None:
    system = [{"type": "text", "text": "Policy: be precise and brief. " * 40, "cache_control": cc()}]
    prompt = (
        gateway.anthropic(gateway.new_key())
        .messages.count_tokens(model=gateway.model, system=system, messages=MESSAGES)
        .input_tokens
    )
    # Room for two uncached prompts a minute.
    cached_key = gateway.new_key(input_tokens_per_minute=2 * prompt)
    first = create(gateway, cached_key, system=system)
    assert first.usage.cache_creation_input_tokens > 0
    for _ in range(6):  # mostly cache reads: each counts only its few uncached tokens
        assert create(gateway, cached_key, system=system).usage.cache_read_input_tokens > 0

    uncached_key = gateway.new_key(input_tokens_per_minute=2 * prompt)
    with pytest.raises(anthropic.RateLimitError) as raised:
        for i in range(6):  # a different prompt each time: every token counts
            create(gateway, uncached_key, system=[{"type": "text", "text": f"{i} " + system[0]["text"]}])
    assert "anthropic-ratelimit-input-tokens-remaining" in raised.value.response.headers


def test_billing_refusal_is_402_and_settled_cost_is_shown(gateway: GatewayServer) -> None:
    broke, paying = gateway.new_key(), gateway.new_key()
    gateway.billing.refuse.add(broke.tenant_id)
    with pytest.raises(anthropic.APIStatusError) as raised:
        create(gateway, broke)
    assert raised.value.status_code == 402
    anthropic_error(raised.value, "billing_error")
    with pytest.raises(openai.APIStatusError) as refused:
        complete(gateway, broke)
    assert refused.value.status_code == 402 and openai_error(refused.value)["type"] == "insufficient_quota"

    gateway.billing.price[paying.tenant_id] = Decimal("0.000123450")
    raw = gateway.anthropic(paying).messages.with_raw_response.create(
        model=gateway.model, max_tokens=2, messages=MESSAGES
    )
    assert raw.headers["kvgate-cost-usd"] == "0.000123450"
    assert raw.parse().usage.model_extra["cost_usd"] == "0.000123450"
    completion = complete(gateway, paying)
    assert completion.usage.model_extra["cost_usd"] == "0.000123450"
    # No price: no cost field at all.
    assert "cost_usd" not in (create(gateway, gateway.new_key()).usage.model_extra or {})


def test_unexpected_failures_are_500_in_shape(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    gateway.billing.crash.add(key.tenant_id)
    with pytest.raises(anthropic.InternalServerError) as raised:
        create(gateway, key)
    assert raised.value.status_code == 500
    assert anthropic_error(raised.value, "api_error") == "Internal server error"
    with pytest.raises(openai.InternalServerError) as refused:
        complete(gateway, key)
    assert openai_error(refused.value)["type"] == "server_error"


@pytest.fixture(scope="module")
def full_gateway(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """A gateway whose engine refuses every request: its waiting queue holds none."""
    url = f"sqlite:///{tmp_path_factory.mktemp('full') / 'kvgate.db'}"
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=url, engine_overrides={"max_waiting": 0}).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_full_engine_queue_is_529_at_once(full_gateway: GatewayServer) -> None:
    key = full_gateway.new_key(requests_per_minute=100)
    with pytest.raises(anthropic.OverloadedError) as raised:
        create(full_gateway, key)
    assert anthropic_error(raised.value, "overloaded_error") == "Overloaded"
    assert raised.value.response.headers["retry-after"] == "1"
    assert raised.value.response.elapsed.total_seconds() < 5
    with pytest.raises(openai.InternalServerError) as refused:
        complete(full_gateway, key)
    assert refused.value.status_code == 503 and openai_error(refused.value)["code"] == "overloaded"
    assert full_gateway.billing.released  # billing's admission was handed back
    # The refused requests did not use up the key's request budget.
    remaining = httpx.get(f"{full_gateway.base_url}/healthz")
    assert remaining.status_code == 200 and remaining.headers["request-id"].startswith("req_")
