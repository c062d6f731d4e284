"""A lone surrogate (\\ud800) anywhere in a request is a clear 400 on every API, never a 500.

JSON can spell one (an escape, or raw surrogate bytes, which Python's json module
accepts); UTF-8 cannot, so the tokenizer, the cache-salt HMAC and the database
drivers would all fail on it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.gateway.harness import ADMIN_TOKEN, GatewayServer

LONE = "\ud800"
PAIR = "\U0001f600"  # one emoji: json.dumps sends it as the valid pair \ud83d\ude00


def post(server: GatewayServer, path: str, payload: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    # json.dumps escapes non-ASCII (ensure_ascii), so a lone surrogate goes out as the escape \ud800.
    content = json.dumps(payload).encode()
    return httpx.post(
        f"{server.base_url}{path}", content=content, headers={"content-type": "application/json", **headers}
    )


def anthropic_cases(model: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    base = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]}
    return [
        ("messages.0.content", {**base, "messages": [{"role": "user", "content": f"Hi {text}"}]}),
        (
            "messages.0.content.0.text",
            {**base, "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]},
        ),
        ("system", {**base, "system": text}),
        ("stop_sequences.0", {**base, "stop_sequences": [text]}),
        ("metadata.user_id", {**base, "metadata": {"user_id": text}}),
        ("cache_salt", {**base, "cache_salt": text}),
        ("tools.0.description", {**base, "tools": [{"name": "t", "description": text, "input_schema": {}}]}),
    ]


def openai_cases(model: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    base = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]}
    return [
        ("messages.0.content", {**base, "messages": [{"role": "user", "content": text}]}),
        (
            "messages.0.content",
            {**base, "messages": [{"role": "system", "content": f"be {text} brief"}, *base["messages"]]},
        ),
        ("stop", {**base, "stop": text}),
        ("user", {**base, "user": text}),
        ("cache_salt", {**base, "cache_salt": text}),
        ("metadata.k", {**base, "metadata": {"k": text}}),
        (
            "tools.0.function.description",
            {**base, "tools": [{"type": "function", "function": {"name": "f", "description": text}}]},
        ),
    ]


@pytest.mark.parametrize("api", ["anthropic", "count_tokens", "openai"])
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(gateway: GatewayServer, api: str) -> None:
    key = gateway.new_key()
    if api == "openai":
        path, headers, cases = "/v1/chat/completions", {"authorization": f"Bearer {key.key}"}, openai_cases
    else:
        path = "/v1/messages" if api == "anthropic" else "/v1/messages/count_tokens"
        headers, cases = {"x-api-key": key.key}, anthropic_cases
    for where, payload in cases(gateway.model, LONE):
        if api == "count_tokens":
            if where.split(".")[0] not in ("messages", "system", "tools"):
                continue  # not a count_tokens field
            payload = {k: v for k, v in payload.items() if k != "max_tokens"}
        response = post(gateway, path, payload, headers)
        assert response.status_code == 400, (where, response.text)
        error = response.json()["error"]
        assert error["message"].startswith(f"{where}: the text contains a lone surrogate (U+D800)"), (where, error)
    # The same text with a valid pair (an emoji) is fine.
    good: dict[str, Any] = {"model": gateway.model, "messages": [{"role": "user", "content": f"Hi {PAIR}"}]}
    if api != "count_tokens":
        good["max_tokens"] = 2
    response = post(gateway, path, good, headers)
    assert response.status_code == 200, response.text


def test_raw_surrogate_bytes_are_refused_too(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    content = b'{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "a \xed\xa0\x80 b"}]}' % (
        gateway.model.encode()
    )
    response = httpx.post(
        f"{gateway.base_url}/v1/messages",
        content=content,
        headers={"x-api-key": key.key, "content-type": "application/json"},
    )
    assert response.status_code == 400 and "lone surrogate" in response.json()["error"]["message"], response.text


def test_admin_bodies_with_a_lone_surrogate_are_a_400(gateway: GatewayServer) -> None:
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    refused = post(gateway, "/admin/v1/tenants", {"name": f"acme {LONE}"}, admin)
    assert refused.status_code == 400 and "name: the text contains a lone surrogate" in refused.text, refused.text
    tenant = post(gateway, "/admin/v1/tenants", {"name": f"acme {PAIR}"}, admin)
    assert tenant.status_code == 201 and tenant.json()["name"] == f"acme {PAIR}"
    tenant_id = tenant.json()["id"]
    key = post(gateway, f"/admin/v1/tenants/{tenant_id}/keys", {"name": LONE}, admin)
    assert key.status_code == 400 and "lone surrogate" in key.text
    assert post(gateway, f"/admin/v1/tenants/{tenant_id}/keys", {"name": "ok"}, admin).status_code == 201
