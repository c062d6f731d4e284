"""GET /metrics: requests by route and status, the tokens of usage records, and the embedded engine's metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.harness import GatewayServer
from tests.gateway.test_messages_caching import ask, system_block

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """A gateway of its own, so that every count below is this module's traffic alone."""
    url = f"sqlite:///{tmp_path_factory.mktemp('metrics') / 'kvgate.db'}"
    gw = GatewayServer(model_dir=tiny_llama_dir, database_url=url).start()
    try:
        yield gw
    finally:
        gw.stop()


def scrape(server: GatewayServer) -> Samples:
    response = server.admin.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_requests_tokens_and_engine_cache_hits(server: GatewayServer) -> None:
    key = server.new_key()
    body = {"system": system_block(), "messages": [{"role": "user", "content": "Do you fix brakes?"}]}
    first = ask(server, key, **body)
    second = ask(server, key, **body)
    with pytest.raises(anthropic.AuthenticationError):
        ask(server, "kvg-" + "x" * 43)
    samples = scrape(server)

    requests = "kvgate:gateway_requests_total"
    assert value(samples, requests, route="/v1/messages", status="200") == 2
    assert value(samples, requests, route="/v1/messages", status="401") == 1
    assert value(samples, requests, route="/v1/messages", status="500") == 0
    assert value(samples, "kvgate:gateway_request_duration_seconds_count", route="/v1/messages") == 3

    model, tokens = server.model, "kvgate:gateway_tokens_total"
    assert second.usage.cache_read_input_tokens > 0
    assert value(samples, tokens, model=model, category="cache_read") == second.usage.cache_read_input_tokens
    assert value(samples, tokens, model=model, category="cache_write_5m") == first.usage.cache_creation_input_tokens
    assert value(samples, tokens, model=model, category="cache_write_1h") == 0
    assert value(samples, tokens, model=model, category="input") == first.usage.input_tokens + second.usage.input_tokens
    assert (
        value(samples, tokens, model=model, category="output") == first.usage.output_tokens + second.usage.output_tokens
    )
    assert value(samples, "kvgate:gateway_usage_records_total", model=model, status="ok") == 2
    # The embedded engine's own counters come in the same scrape.
    assert value(samples, "vllm:prefix_cache_hits_total", model_name=model) == second.usage.cache_read_input_tokens
    assert value(samples, "vllm:request_success_total", model_name=model, finished_reason="length") == 2


def test_unknown_paths_share_one_label_and_metrics_need_the_admin_token(server: GatewayServer) -> None:
    for path in ("/no/such/path", "/another/one"):
        assert httpx.get(server.base_url + path).status_code == 404
    samples = scrape(server)
    assert value(samples, "kvgate:gateway_requests_total", route="unmatched", status="404") == 2
    assert not any(dict(labels).get("route", "").startswith(("/no/", "/another/")) for _, labels in samples)

    assert httpx.get(server.base_url + "/metrics").status_code == 401
    bad = {"authorization": "Bearer not-the-token"}
    assert httpx.get(server.base_url + "/metrics", headers=bad).status_code == 401
