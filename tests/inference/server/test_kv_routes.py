"""GET /kv/info and /kv/snapshot, and the promise behind them: a gateway computes exactly the engine's block hashes."""

from __future__ import annotations

import httpx
import msgspec

from inference.hashing import BlockHasher
from kvgate import kv_events
from kvgate.kv_events import KVSnapshot
from tests.inference.kv_event_helpers import (
    NATS_URL,
    purge,
    read_batches,
    replay,
    snapshot_state,
    stored_events,
    unique_engine_id,
)
from tests.inference.server.conftest import serve, tiny_settings
from tests.inference.server.helpers import token_prompt, unique_salt


def test_an_engine_without_events_says_so_and_has_no_snapshot(tiny_server):
    info = httpx.get(f"{tiny_server.url}/kv/info").json()
    core = tiny_server.engine.core
    assert info == {
        "engine_id": core.engine_id,
        "model_id": "tiny-llama-v1",
        "block_size": 16,
        "hash_algo": "sha256",
        "kv_events_subject": None,
        "shared_tier": False,
        "kernel_plan": {**core.plan.describe(), "digest": core.plan.digest()},
    }
    assert not any(name.startswith("kvgate:kv_event") for name in tiny_server.metrics())


def test_the_kernel_plan_is_served_on_kv_info_health_and_metrics(tiny_server):
    core = tiny_server.engine.core
    plan = httpx.get(f"{tiny_server.url}/kv/info").json()["kernel_plan"]
    assert plan["digest"] == core.plan.digest() and plan["dtype"] == "float32"  # the tiny model loads in float32
    assert plan["attention"] == core.plan.attention and plan["isa"] == dict(core.plan.isa)
    assert httpx.get(f"{tiny_server.url}/health").content == b""  # plain /health stays vLLM's empty 200
    detail = httpx.get(f"{tiny_server.url}/health", params={"detail": "true"}).json()
    assert detail == {"status": "ok", "kernel_plan": plan}
    text = httpx.get(f"{tiny_server.url}/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("kvgate:kernel_plan_info{"))
    assert f'digest="{core.plan.digest()}"' in line and f'attention="{core.plan.attention}"' in line
    assert line.endswith(" 1.0")
    response = httpx.get(f"{tiny_server.url}/kv/snapshot")
    assert response.status_code == 404
    assert "KVGATE_NATS_URL" in response.json()["error"]["message"]


def test_the_gateways_hashes_are_the_engines_and_the_snapshot_is_the_replay_of_the_events(tiny_llama_dir):
    engine_id = unique_engine_id()
    with serve(tiny_settings(tiny_llama_dir, nats_url=NATS_URL, engine_id=engine_id, hash_algo="xxhash128")) as server:
        info = httpx.get(f"{server.url}/kv/info").json()
        subject = kv_events.subject("tiny-llama-v1", engine_id)
        assert info["engine_id"] == engine_id and info["hash_algo"] == "xxhash128"
        assert info["kv_events_subject"] == subject
        try:
            # What a gateway does: hashes from /kv/info and the cache_salt it sends.
            hasher = BlockHasher(model_id=info["model_id"], block_size=info["block_size"], algo=info["hash_algo"])
            salt, prompt = unique_salt(), token_prompt(70, seed=1611)  # 4 committed blocks of 4 full ones
            body = {"prompt": prompt, "max_tokens": 2, "cache_salt": salt}
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
            # Regions only choose which blocks are committed, and their TTL: the hashes are the same.
            regioned = token_prompt(70, seed=1612)
            body = {
                "prompt": regioned,
                "max_tokens": 2,
                "cache_salt": salt,
                "cache_regions": [{"end": 40, "ttl_s": 600}],
            }
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
            unsalted = token_prompt(40, seed=1613)
            assert (
                httpx.post(f"{server.url}/v1/completions", json={"prompt": unsalted, "max_tokens": 2}).status_code
                == 200
            )

            response = httpx.get(f"{server.url}/kv/snapshot")
            assert response.status_code == 200
            snapshot = msgspec.json.decode(response.content, type=KVSnapshot)
            assert snapshot.engine_id == engine_id
            state = snapshot_state(snapshot)
            expected = [
                *hasher.hash_blocks(prompt, salt)[:4],
                *hasher.hash_blocks(regioned, salt)[:2],
                *hasher.hash_blocks(unsalted, None)[:2],
            ]
            assert {h for _, h in state} == set(expected) and {m for m, _ in state} == {"CPU"}

            batches = read_batches(subject, until_seq=snapshot.seq)
            assert replay(batches) == state
            metrics = server.metrics()
            assert metrics["kvgate:kv_event_batches_total"] >= snapshot.seq
            assert metrics["kvgate:kv_event_batches_published_total"] >= snapshot.seq
            assert metrics["kvgate:kv_event_batches_dropped_total"] == 0
            assert metrics["kvgate:kv_event_live_blocks"] == len(state)
            ttls = {h: e.ttl_s for e in stored_events(batches, "CPU") for h in e.block_hashes}
            assert [ttls[h] for h in expected] == [300] * 4 + [600] * 2 + [300] * 2
        finally:
            purge(subject)
