"""The shared Redis tier, against the real Redis at 127.0.0.1:6379, with two tiny-model engines.

Engine A computes a prompt and writes its blocks through to Redis; engine B (another
engine instance, its device pool empty) reads them. Each test has fingerprints and
salts of its own and deletes its keys (see conftest.shared).
"""

from __future__ import annotations

import random
import threading
import uuid

import redis

from inference.tiers.circuit_breaker import CircuitBreaker
from inference.types import CacheRegion, CacheSpec, SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.helpers import committed_hashes
from tests.inference.tiers.redis_helpers import closed_port, redis_tier

GREEDY_8 = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def salt() -> str:
    return f"tenant-{uuid.uuid4().hex}"


def test_engine_b_reads_the_blocks_engine_a_wrote_and_outputs_what_a_cold_run_does(shared, tiny_llama_dir):
    # Chunks of 4 blocks: the 9-block prefix takes 3 lookup and 3 load round trips.
    a = shared(tiny_llama_dir, kv_redis_chunk_blocks=4)
    b = shared(tiny_llama_dir, kv_redis_chunk_blocks=4)
    prompt, spec = random_prompt(random.Random(81), 150), CacheSpec(salt=salt())
    cold = checked(a.generate(prompt, GREEDY_8, spec))
    assert cold.usage.cached_tokens == 0 and cold.usage.cache_write_tokens == 144
    a.tiers.flush()
    assert redis_tier(a).stats.stores == 9

    warm = checked(b.generate(prompt, GREEDY_8, spec))
    assert warm.usage.cached_tokens_by_tier == by_tier(redis=144)
    assert warm.usage.cache_write_tokens == 0
    assert warm.token_ids == cold.token_ids
    assert redis_tier(b).stats.loads == 9 and redis_tier(b).stats.checksum_failures == 0
    # Now on B's device: the next run reads it there, not from Redis again.
    again = checked(b.generate(prompt, GREEDY_8, spec))
    assert again.usage.cached_tokens_by_tier == by_tier(device=144) and again.token_ids == cold.token_ids
    assert redis_tier(b).stats.loads == 9


def test_another_tenants_identical_prompt_reads_nothing_in_any_tier_on_any_engine(shared, tiny_llama_dir):
    a = shared(tiny_llama_dir, host=32)
    b = shared(tiny_llama_dir, host=32)
    prompt, alice = random_prompt(random.Random(82), 150), CacheSpec(salt=salt())
    cold = checked(a.generate(prompt, GREEDY_8, alice))
    a.tiers.flush()
    # Each other tenant asks once, on one engine (its own run writes its own blocks, which it may read later).
    for engine, other in ((a, CacheSpec(salt=salt())), (b, CacheSpec(salt=salt())), (b, CacheSpec())):
        out = checked(engine.generate(prompt, GREEDY_8, other))
        assert out.usage.cached_tokens == 0 and out.usage.cached_tokens_by_tier == by_tier()
        assert out.usage.cache_write_tokens == 144
    assert redis_tier(b).stats.loads == 0
    # Paired positive: alice's own prompt on B comes from Redis.
    same = checked(b.generate(prompt, GREEDY_8, alice))
    assert same.usage.cached_tokens_by_tier == by_tier(redis=144) and same.token_ids == cold.token_ids


def test_keys_carry_the_ttl_and_a_hit_refreshes_it(shared, tiny_llama_dir, redis_client: redis.Redis):
    a = shared(tiny_llama_dir)
    b = shared(tiny_llama_dir)
    rng, s = random.Random(83), salt()
    short, long = random_prompt(rng, 100), random_prompt(rng, 100)
    one_hour = CacheSpec(salt=s, regions=(CacheRegion(end=100, ttl_s=3600),))
    checked(a.generate(short, GREEDY_8, CacheSpec(salt=s)))  # the default 5-minute TTL
    checked(a.generate(long, GREEDY_8, one_hour))
    a.tiers.flush()
    tier = redis_tier(a)
    short_keys = [tier.key(h) for h in committed_hashes(a, short, s)]
    long_keys = [tier.key(h) for h in committed_hashes(a, long, s)]
    assert all(0 < redis_client.pttl(k) <= 300_000 for k in short_keys)
    assert all(300_000 < redis_client.pttl(k) <= 3_600_000 for k in long_keys)

    for key in short_keys:  # as if most of the TTL had passed
        redis_client.pexpire(key, 20_000)
    hit = checked(b.generate(short, GREEDY_8, CacheSpec(salt=s)))
    assert hit.usage.cached_tokens_by_tier == by_tier(redis=96)
    assert all(200_000 < redis_client.pttl(k) <= 300_000 for k in short_keys)  # GETEX PX on the hit

    # A device hit on A extends the block's life there, and so Redis's (PEXPIRE GT): never shorter.
    for key in long_keys:
        redis_client.pexpire(key, 20_000)
    for key in short_keys:  # longer than anything A asks for them: kept
        redis_client.pexpire(key, 1_000_000)
    a.clock.advance(120)  # past the refresh lag (a minute at most): a hit is worth a PEXPIRE
    assert checked(a.generate(long, GREEDY_8, one_hour)).usage.cached_tokens_by_tier == by_tier(device=96)
    assert checked(a.generate(short, GREEDY_8, CacheSpec(salt=s))).usage.cached_tokens_by_tier == by_tier(device=96)
    a.tiers.flush()
    assert all(3_000_000 < redis_client.pttl(k) <= 3_600_000 for k in long_keys)
    assert all(900_000 < redis_client.pttl(k) <= 1_000_000 for k in short_keys)


def test_a_corrupt_block_is_dropped_and_recomputed(shared, tiny_llama_dir, redis_client: redis.Redis):
    a = shared(tiny_llama_dir)
    b = shared(tiny_llama_dir)
    prompt, spec = random_prompt(random.Random(84), 150), CacheSpec(salt=salt())
    cold = checked(a.generate(prompt, GREEDY_8, spec))
    a.tiers.flush()
    tier = redis_tier(a)
    bad = tier.key(committed_hashes(a, prompt, spec.salt)[5])
    offset = tier.payload_offset + 1000
    flipped = bytes([redis_client.getrange(bad, offset, offset)[0] ^ 0x40])
    redis_client.setrange(bad, offset, flipped)

    warm = checked(b.generate(prompt, GREEDY_8, spec))
    assert redis_tier(b).stats.checksum_failures == 1
    assert warm.usage.cached_tokens_by_tier == by_tier(redis=80)  # blocks 0-4; 5 on were recomputed
    assert warm.usage.cache_write_tokens == 64
    assert warm.token_ids == cold.token_ids
    # B wrote its recomputed block 5 back: a third engine reads the whole prefix, intact.
    b.tiers.flush()
    c = shared(tiny_llama_dir)
    third = checked(c.generate(prompt, GREEDY_8, spec))
    assert third.usage.cached_tokens_by_tier == by_tier(redis=144) and third.token_ids == cold.token_ids
    assert redis_tier(c).stats.checksum_failures == 0


def test_redis_unreachable_means_recompute_never_an_error(shared, tiny_llama_dir):
    down = shared(tiny_llama_dir, url=f"redis://127.0.0.1:{closed_port()}/0", kv_redis_timeout_ms=200)
    tier = redis_tier(down)
    tier.breaker = CircuitBreaker(monotonic=lambda: 0.0)  # its backoff never ends in this test, however slow
    prompt, spec = random_prompt(random.Random(85), 150), CacheSpec(salt=salt())
    outputs = [checked(down.generate(prompt, GREEDY_8, spec)) for _ in range(2)]
    down.tiers.flush()
    assert all(out.usage.cached_tokens_by_tier["redis"] == 0 for out in outputs)
    assert outputs[1].usage.cached_tokens_by_tier == by_tier(device=144)  # the device cache still works
    assert tier.stats.errors == 1 and tier.stats.skipped >= 1  # one failure opened the breaker: the rest skipped
    assert tier.stats.loads == 0 and tier.stats.stores == 0 and tier.breaker.num_opened == 1
    # Paired positive: the same requests with Redis up are shared.
    up_a, up_b = shared(tiny_llama_dir), shared(tiny_llama_dir)
    cold = checked(up_a.generate(prompt, GREEDY_8, spec))
    up_a.tiers.flush()
    warm = checked(up_b.generate(prompt, GREEDY_8, spec))
    assert warm.usage.cached_tokens_by_tier == by_tier(redis=144)
    assert cold.token_ids == warm.token_ids == outputs[0].token_ids


def test_an_engine_with_another_model_fingerprint_reads_nothing(shared, tiny_llama_dir):
    a = shared(tiny_llama_dir, namespace="model-1")
    other = shared(tiny_llama_dir, namespace="model-2")
    prompt, spec = random_prompt(random.Random(86), 150), CacheSpec(salt=salt())
    checked(a.generate(prompt, GREEDY_8, spec))
    a.tiers.flush()
    assert redis_tier(a).prefix != redis_tier(other).prefix
    miss = checked(other.generate(prompt, GREEDY_8, spec))
    assert miss.usage.cached_tokens == 0 and redis_tier(other).stats.loads == 0
    # Paired positive: an engine with A's fingerprint reads it.
    same = shared(tiny_llama_dir, namespace="model-1")
    hit = checked(same.generate(prompt, GREEDY_8, spec))
    assert hit.usage.cached_tokens_by_tier == by_tier(redis=144)


def test_a_request_waits_for_its_remote_blocks_while_the_other_requests_step(shared, tiny_llama_dir):
    a, b = shared(tiny_llama_dir), shared(tiny_llama_dir, device=32)
    rng = random.Random(90)
    prompt, spec = random_prompt(rng, 150), CacheSpec(salt=salt())
    cold = checked(a.generate(prompt, GREEDY_8, spec))
    a.tiers.flush()
    tier = redis_tier(b)
    gate, fetch = threading.Event(), tier._fetch
    tier._fetch = lambda keys, pxs: (gate.wait(timeout=60), fetch(keys, pxs))[1]  # Redis as slow as we like
    busy = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    b.add_request("busy", random_prompt(rng, 40), busy, CacheSpec(salt=salt()))
    b.step()
    b.add_request("warm", prompt, GREEDY_8, spec)
    try:
        for _ in range(3):
            outputs = b.step()
            assert b.num_waiting == 1  # "warm" waits for its blocks...
            assert [o.request_id for o in outputs if o.token_ids] == ["busy"]  # ...while "busy" decodes
    finally:
        gate.set()
    finished = None
    while finished is None:
        finished = next((o.finished for o in b.step() if o.request_id == "warm" and o.finished), None)
    checked(finished)
    assert finished.usage.cached_tokens_by_tier == by_tier(redis=144) and finished.token_ids == cold.token_ids


def test_a_restarted_engine_reads_its_blocks_back_from_redis(shared, tiny_llama_dir):
    first = shared(tiny_llama_dir)
    prompt, spec = random_prompt(random.Random(92), 150), CacheSpec(salt=salt())
    cold = checked(first.generate(prompt, GREEDY_8, spec))
    first.close()  # drains the writer; no disk tier, so nothing else keeps the blocks
    again = shared(tiny_llama_dir)
    warm = checked(again.generate(prompt, GREEDY_8, spec))
    assert warm.usage.cached_tokens_by_tier == by_tier(redis=144) and warm.token_ids == cold.token_ids


def test_the_tier_reports_its_blocks_as_remote_kv_events_on_every_engine_that_knows_them(
    shared, tiny_llama_dir, redis_client: redis.Redis
):
    """Stores (write-through), lookups by another engine, and expiry are KV events of medium REMOTE."""
    from kvgate.kv_events import KVEventBatch
    from tests.inference.kv_event_helpers import NATS_URL, removed_hashes, stored_events, unique_engine_id

    # nats_url makes the engines collect events; the batches are read from the log's sink, not from NATS.
    a = shared(tiny_llama_dir, nats_url=NATS_URL, engine_id=unique_engine_id())
    b = shared(tiny_llama_dir, nats_url=NATS_URL, engine_id=unique_engine_id())
    seen: dict[str, list[KVEventBatch]] = {"a": [], "b": []}
    a.kv_events.set_sink(seen["a"].append)
    b.kv_events.set_sink(seen["b"].append)
    prompt, spec = random_prompt(random.Random(1616), 90), CacheSpec(salt=salt())
    hashes = committed_hashes(a, prompt, spec.salt)
    assert len(hashes) == 5

    checked(a.generate(prompt, GREEDY_8, spec))
    a.tiers.flush()  # the writer thread reports each block once Redis has it
    a.kv_events_tick()
    remote = stored_events(seen["a"], "REMOTE")
    assert {h for e in remote for h in e.block_hashes} == set(hashes)
    assert all(e.ttl_s == 300 and e.expires_at is not None and e.token_ids == [] for e in remote)
    snapshot = {(block.medium, block.block_hash) for block in a.kv_events.snapshot().blocks}
    assert {("REMOTE", h.hex()) for h in hashes} <= snapshot
    # The paired negative: B has reported nothing of them before it reads them.
    b.kv_events_tick()
    assert not stored_events(seen["b"], "REMOTE")

    warm = checked(b.generate(prompt, GREEDY_8, spec))
    assert warm.usage.cached_tokens_by_tier == by_tier(redis=80)
    b.kv_events_tick()
    assert {h for e in stored_events(seen["b"], "REMOTE") for h in e.block_hashes} == set(hashes)

    # Expiry: once the known expiry has passed, the sweep reports the blocks removed.
    a.clock.advance(301)  # type: ignore[attr-defined]
    a.kv_events_tick(sweep=True)
    assert set(hashes) <= set(removed_hashes(seen["a"], "REMOTE"))
    assert not {("REMOTE", h.hex()) for h in hashes} & {(x.medium, x.block_hash) for x in a.kv_events.snapshot().blocks}

    # A key found gone is reported removed by the engine that knew it.
    redis_client.delete(redis_tier(b).key(hashes[0]))
    assert redis_tier(b).lookup(hashes[0], prompt[:16], b.clock.now()) is None
    b.kv_events_tick()
    assert hashes[0] in removed_hashes(seen["b"], "REMOTE")


def test_engines_whose_kernel_plans_differ_share_nothing_and_equal_plans_share(shared, tiny_llama_dir):
    """The plan is in the fingerprint: KV computed by other kernels would make warm output differ from cold."""
    best = shared(tiny_llama_dir)
    portable = shared(tiny_llama_dir, kernel_isa="generic")
    assert best.plan != portable.plan and best.plan.variant("paged_attention") != "generic"
    assert redis_tier(best).prefix != redis_tier(portable).prefix
    prompt, spec = random_prompt(random.Random(87), 150), CacheSpec(salt=salt())
    checked(best.generate(prompt, GREEDY_8, spec))
    best.tiers.flush()
    miss = checked(portable.generate(prompt, GREEDY_8, spec))
    assert miss.usage.cached_tokens == 0 and redis_tier(portable).stats.loads == 0
    # Paired positive: an engine with the same plan reads what the first wrote.
    same = shared(tiny_llama_dir)
    assert same.plan == best.plan
    hit = checked(same.generate(prompt, GREEDY_8, spec))
    assert hit.usage.cached_tokens_by_tier == by_tier(redis=144)
