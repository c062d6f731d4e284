import random

import pytest

from inference.block_pool import BlockPool, KVBlock


def commit_new(pool: BlockPool, key: bytes, ttl: int = 300, now: float = 0.0) -> KVBlock:
    (block,) = pool.allocate(1, now)
    assert pool.commit(block, key, (1, 2), ttl, now)
    return block


def test_fresh_pool_is_all_free_and_empty_blocks_go_first():
    pool = BlockPool(4)
    assert pool.num_free == 4
    a = commit_new(pool, b"a")
    pool.release([a], now=1)
    # The three never-used blocks are handed out before the cached one is evicted.
    got = pool.allocate(3, now=2)
    assert a not in got and pool.cached == {b"a": a}
    pool.check_invariants()


def test_lru_order_and_tail_first_release():
    pool = BlockPool(6)
    req1 = pool.allocate(3, 0)
    for i, b in enumerate(req1):
        pool.commit(b, b"r1-%d" % i, (i,), 300, 0)
    req2 = pool.allocate(3, 0)
    for i, b in enumerate(req2):
        pool.commit(b, b"r2-%d" % i, (i,), 300, 0)
    pool.release(req1, now=1)
    pool.release(req2, now=2)
    pool.check_invariants()
    # req1 was released first, and within a request the deepest block goes first.
    order = [pool.allocate(1, now=3)[0] for _ in range(6)]
    assert order == [req1[2], req1[1], req1[0], req2[2], req2[1], req2[0]]
    assert pool.num_evictions == 6 and not pool.cached


def test_blocks_in_use_are_never_evicted():
    pool = BlockPool(3)
    held = commit_new(pool, b"held")
    loose = commit_new(pool, b"loose")
    pool.release([loose], now=1)
    got = pool.allocate(2, now=2)
    assert held not in got and loose in got
    assert pool.cached == {b"held": held}
    with pytest.raises(AssertionError):
        pool.allocate(1, now=3)


def test_a_hit_takes_the_block_out_of_the_free_queue_and_refreshes_it():
    pool = BlockPool(2)
    a = commit_new(pool, b"a")
    b = commit_new(pool, b"b")
    pool.release([a], now=1)
    pool.release([b], now=2)
    assert pool.get_cached(b"a", (1, 2), now=3) is a
    pool.touch([a], [300], now=3)
    pool.release([a], now=4)
    # a was used more recently than b now, so b goes first.
    assert pool.allocate(1, now=5) == [b]


def test_expired_blocks_are_evicted_before_live_ones_and_never_hit():
    pool = BlockPool(3)
    long_ttl = commit_new(pool, b"long", ttl=3600)
    short_ttl = commit_new(pool, b"short", ttl=300)
    other = commit_new(pool, b"other", ttl=3600)
    pool.release([long_ttl], now=0)
    pool.release([other], now=10)
    pool.release([short_ttl], now=20)
    # At t=400 "short" (released last) has expired while the older 1h blocks have not.
    assert pool.allocate(1, now=400) == [short_ttl]
    assert pool.num_expired_evictions == 1
    assert pool.get_cached(b"long", (1, 2), now=400) is long_ttl
    assert pool.get_cached(b"long", (1, 2), now=3601) is None  # expired: a miss, and uncached
    assert b"long" not in pool.cached and b"other" in pool.cached
    pool.check_invariants()


def test_a_hash_collision_is_a_miss():
    pool = BlockPool(2)
    a = commit_new(pool, b"h")
    pool.release([a], now=0)
    assert pool.get_cached(b"h", (1, 2), now=1) is a
    assert pool.get_cached(b"h", (9, 9), now=1) is None


def test_commit_of_a_hash_already_live_is_refused():
    pool = BlockPool(2)
    first = commit_new(pool, b"h")
    (second,) = pool.allocate(1, 0)
    assert not pool.commit(second, b"h", (1, 2), 300, 0)
    pool.release([first, second], now=1)
    assert pool.cached == {b"h": first}
    pool.check_invariants()


def test_ttl_is_the_longest_any_user_asked_for():
    pool = BlockPool(1)
    a = commit_new(pool, b"a", ttl=300)
    pool.touch([a], [3600], now=0)
    pool.release([a, a], now=0)
    assert a.ttl_s == 3600 and a.expires_at == 3600
    assert pool.get_cached(b"a", (1, 2), now=1000) is a


def test_randomized_operations_keep_the_invariants():
    rng = random.Random(7)
    pool = BlockPool(64)
    live: list[list[KVBlock]] = []
    now = 0.0
    keys = [b"k%d" % i for i in range(200)]
    for _ in range(5000):
        now += rng.random() * 5
        op = rng.random()
        if op < 0.4 and pool.num_free:
            blocks = pool.allocate(rng.randint(1, min(4, pool.num_free)), now)
            for b in blocks:
                if rng.random() < 0.7:
                    pool.commit(b, rng.choice(keys), (1,), rng.choice([300, 3600]), now)
            live.append(blocks)
        elif op < 0.75 and live:
            pool.release(live.pop(rng.randrange(len(live))), now)
        else:
            hit = pool.get_cached(rng.choice(keys), (1,), now)
            if hit is not None:
                pool.touch([hit], [rng.choice([0, 300, 3600])], now)
                live.append([hit])
        pool.check_invariants()
        held = {b.block_id for blocks in live for b in blocks}
        assert pool.num_used == len(held)
        for block in pool.blocks:
            assert block.ref_count == sum(b is block for blocks in live for b in blocks)
    for blocks in live:
        pool.release(blocks, now)
    pool.check_invariants()
    assert pool.num_free == 64  # nothing leaked
