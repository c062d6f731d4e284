"""Schemathesis against the running gateway's own OpenAPI schema: no input gets a 5xx.

Positive cases (valid per the schema) really run on the engine, so this gateway's
engine has a short context (max_model_len 160) to bound every generation.
KVGATE_FUZZ_EXAMPLES raises the number of cases per operation (default 30).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.gateway.harness import ADMIN_TOKEN, GatewayServer

WITH_BODY = [
    ("/v1/messages", "POST"),
    ("/v1/messages/count_tokens", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/responses", "POST"),
    ("/v1/completions", "POST"),
    ("/admin/v1/tenants", "POST"),
    ("/admin/v1/tenants/{tenant_id}/keys", "POST"),
]
# Only a string path parameter: every string is valid, so there are no negative cases.
PATH_ONLY = [("/v1/models/{model_id}", "GET"), ("/admin/v1/keys/{key_id}/revoke", "POST")]
CASES = [
    pytest.param(path, method, mode, id=f"{method} {path} {mode.value}")
    for path, method in WITH_BODY + PATH_ONLY
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or (path, method) in WITH_BODY
]


@pytest.fixture(scope="module")
def fuzz_gateway(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'kvgate.db'}"
    server = GatewayServer(
        model_dir=tiny_llama_dir, database_url=url, engine_overrides={"max_model_len": 160}, min_cacheable_tokens=16
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(("path", "method", "mode"), CASES)
def test_no_generated_input_gets_a_server_error(
    fuzz_gateway: GatewayServer, path: str, method: str, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_dict(fuzz_gateway.app.openapi())
    key = fuzz_gateway.new_key()
    headers = {"x-api-key": key.key, "authorization": f"Bearer {ADMIN_TOKEN}", "anthropic-version": "2023-06-01"}
    strategy = schema[path][method].as_strategy(generation_mode=mode)
    seen: dict[int, int] = {}

    @settings(
        max_examples=int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "30")),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, use_real_model=st.booleans())
    def check(case: schemathesis.Case, use_real_model: bool) -> None:
        # Half the cases name the served model, so valid bodies get past the model check and run.
        if use_real_model and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = fuzz_gateway.model
        response = case.call(base_url=fuzz_gateway.base_url, headers=headers, timeout=60)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case.as_curl_command(), response.text)
        assert "request-id" in response.headers
        if response.status_code >= 400:
            body = response.json()
            assert ("error" in body) and (body.get("type") == "error" or "code" in body["error"]), body

    check()
    assert sum(seen.values()) > 0
