"""A lower tier's index: LRU victims, expired entries first, soft pinning within its share, locks respected."""

from __future__ import annotations

from inference.tiers.lru_index import LruIndex, TierEntry


def entry(name: str, *, ttl: int = 300, expires_at: float = 1e9) -> TierEntry:
    return TierEntry(block_hash=name.encode(), token_ids=(1,), ttl_s=ttl, expires_at=expires_at, last_used=0.0)


def fill(index: LruIndex, *entries: TierEntry) -> None:
    for e in entries:
        index.add(e)


def test_victims_come_in_lru_order_and_a_touch_makes_an_entry_recent():
    index = LruIndex(4, pin_min_ttl_s=3600, pin_share=0.5)
    a, b, c = entry("a"), entry("b"), entry("c")
    fill(index, a, b, c)
    assert index.pick_victim(now=0) is a
    index.touch(a)
    assert index.pick_victim(now=0) is b
    index.remove(b)
    assert index.pick_victim(now=0) is c
    assert [e.block_hash for e in index.lru_order()] == [b"c", b"a"]


def test_an_expired_entry_goes_before_older_live_ones():
    index = LruIndex(4, pin_min_ttl_s=3600, pin_share=0.5)
    old, expired = entry("old", expires_at=100), entry("expired", ttl=3600, expires_at=50)
    fill(index, old, expired)
    assert index.pick_victim(now=10) is old  # nothing expired yet: plain LRU
    assert index.pick_victim(now=60) is expired


def test_pinned_entries_are_kept_over_unpinned_ones_within_their_share():
    index = LruIndex(4, pin_min_ttl_s=3600, pin_share=0.5)
    p1, p2, u1 = entry("p1", ttl=3600), entry("p2", ttl=3600), entry("u1")
    fill(index, p1, p2, u1)
    assert index.pick_victim(now=0) is u1  # the pinned ones are older, but pinned
    index.remove(u1)
    assert index.pick_victim(now=0) is p1  # only pinned left: still evictable (soft)


def test_past_their_share_pinned_entries_lose_their_preference():
    index = LruIndex(4, pin_min_ttl_s=3600, pin_share=0.5)
    p1, p2, p3, u1 = entry("p1", ttl=3600), entry("p2", ttl=3600), entry("p3", ttl=3600), entry("u1")
    fill(index, p1, p2, p3, u1)
    assert index.pick_victim(now=0) is p1  # 3 pinned > 2 allowed: plain LRU
    unpinned_only = LruIndex(4, pin_min_ttl_s=3600, pin_share=0.0)
    q, v = entry("q", ttl=3600), entry("v")
    fill(unpinned_only, q, v)
    assert unpinned_only.pick_victim(now=0) is q  # pinning off: plain LRU


def test_a_longer_ttl_moves_an_entry_into_the_pinned_list():
    index = LruIndex(4, pin_min_ttl_s=3600, pin_share=0.5)
    a, b = entry("a"), entry("b")
    fill(index, a, b)
    index.refresh(a, entry("a", ttl=3600, expires_at=2e9))
    assert (a.ttl_s, a.expires_at, index.num_pinned) == (3600, 2e9, 1)
    assert index.pick_victim(now=0) is b


def test_locked_entries_are_never_victims():
    index = LruIndex(2, pin_min_ttl_s=3600, pin_share=0.5)
    a, b = entry("a", expires_at=1), entry("b")
    fill(index, a, b)
    a.locks = 1
    assert index.pick_victim(now=10) is b  # a expired, but is being loaded
    b.locks = 1
    assert index.pick_victim(now=10) is None
