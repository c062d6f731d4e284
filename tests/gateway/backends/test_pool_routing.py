"""The engine pool with the cache-aware router wired in (PoolRouting): events from the real NATS, metrics on the
given registry, the prediction recorded beside the engine's own count.

Two in-process engine servers publish KV events to NATS at 127.0.0.1:4222 under a served model name of
this test's own, so no other test's events reach this pool's consumer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from prometheus_client import CollectorRegistry

from gateway.backends.engine_list import EngineSpec
from gateway.backends.pool import EnginePool
from gateway.backends.pool_routing import PoolRouting
from gateway.backends.served_model import ServedModel
from gateway.routing.cache_aware import CacheAwareRouter
from gateway.settings import GatewaySettings
from inference.settings import EngineSettings
from inference.types import CacheSpec
from kvgate import kv_events
from tests.gateway.backends.test_pool import GREEDY, _run, _wait_for, engine_id
from tests.inference.kv_event_helpers import NATS_URL, purge
from tests.inference.server.conftest import RunningServer, serve, tiny_settings
from tests.inference.server.helpers import expected_hit, token_prompt, unique_salt


class Evented(NamedTuple):
    model: ServedModel
    engines: list[RunningServer]


@pytest.fixture(scope="module")
def evented(tiny_llama_dir: Path) -> Iterator[Evented]:
    name = f"pool-routing-{uuid.uuid4().hex[:8]}"
    settings = tiny_settings(tiny_llama_dir, num_threads=1, nats_url=NATS_URL, served_model_name=name)
    model = ServedModel.load(EngineSettings(model=str(tiny_llama_dir), served_model_name=name))
    with serve(settings) as a, serve(settings) as b:
        try:
            yield Evented(model, [a, b])
        finally:
            for server in (a, b):
                purge(kv_events.subject(name, engine_id(server)))


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_the_pool_routes_on_the_events_of_its_engines_and_records_prediction_and_actual(
    evented: Evented,
) -> None:
    registry = CollectorRegistry(auto_describe=False)
    # No pending guesses: whatever the index holds came from the engines' events.
    routing = PoolRouting(GatewaySettings(nats_url=NATS_URL, route_pending_s=0))
    pool = EnginePool([EngineSpec(e.url) for e in evented.engines], model=evented.model, routing=routing)
    pool.attach_metrics(registry)
    await pool.start()
    try:
        await _wait_for(lambda: all(m.routable for m in pool.members), "both engines known")
        assert isinstance(pool.router, CacheAwareRouter)
        assert routing.event_engines == {engine_id(e): e.url for e in evented.engines}
        assert routing.shared_readers == set()  # no engine here has the shared tier
        consumer = routing.stack.consumer if routing.stack is not None else None
        assert consumer is not None
        await _wait_for(lambda: all(consumer.covers(engine_id(e)) for e in evented.engines), "events followed")

        prompt, salt = token_prompt(70, seed=1616), unique_salt()
        first, output = await _run(pool, prompt, CacheSpec(salt))
        assert output.usage.cached_tokens == 0 and first.placement is not None
        holder = first.placement.engine_id
        assert first.placement.predicted_cached_tokens == 0
        # The holder's own events tell the router where the prefix is.
        index = routing.stack.router.index
        await _wait_for(lambda: len(index) >= expected_hit(70) // 16, "the holder's BlockStored events")

        second, output = await _run(pool, prompt, CacheSpec(salt))
        assert second.placement is not None and second.placement.engine_id == holder
        assert output.usage.cached_tokens == expected_hit(70)
        assert second.placement.predicted_cached_tokens == expected_hit(70)
        assert sample(registry, "kvgate:router_actual_hit_tokens_total", engine=holder) == expected_hit(70)
        assert sample(registry, "kvgate:router_predicted_hit_tokens_total", engine=holder) == expected_hit(70)
        assert sample(registry, "kvgate:router_decisions_total", engine=holder, reason="prefix") == 1
        # Another salt: no prefix anywhere, nothing predicted, nothing read.
        third, output = await _run(pool, prompt, CacheSpec(unique_salt()), GREEDY)
        assert third.placement is not None and third.placement.predicted_cached_tokens == 0
        assert output.usage.cached_tokens == 0
    finally:
        await pool.shutdown()
    assert not consumer.subscribed  # closed with the pool
