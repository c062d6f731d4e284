"""BlockIndex: leading-block counting by tier, expiry, removal, clearing, snapshot replace, the memory bound."""

from __future__ import annotations

from gateway.routing.index import BlockIndex
from gateway.routing.types import PrefixMatch
from inference.hashing import BlockHasher
from kvgate.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, KVSnapshot, SnapshotBlock

NOW = 1_000_000.0
HASHES = BlockHasher(model_id="m", block_size=4).hash_blocks(list(range(40)), "tenant-salt")  # 10 blocks


def stored(hashes, medium="CPU", expires_at: float | None = NOW + 300):
    return BlockStored(hashes, None, [], 4, medium=medium, ttl_s=300, expires_at=expires_at)


def batch(*events, seq=1, engine="e1") -> KVEventBatch:
    return KVEventBatch(ts=NOW, events=list(events), seq=seq, engine_id=engine)


def test_counts_leading_blocks_by_tier_device_then_lower_then_shared():
    index = BlockIndex()
    index.apply("e1", batch(stored(HASHES[:3]), stored(HASHES[3:5], "HOST"), stored(HASHES[5:7], "REMOTE")), now=NOW)
    assert index.match(HASHES, ["e1"], now=NOW) == {"e1": PrefixMatch(3, 2, 2)}
    # The shared tier is one store: another engine reads its blocks too, but only those.
    assert index.match(HASHES, ["e1", "e2"], now=NOW)["e2"] == PrefixMatch(0, 0, 0)
    assert index.match(HASHES[5:], ["e2"], now=NOW)["e2"] == PrefixMatch(0, 0, 2)
    assert index.match(HASHES[5:], ["e2"], now=NOW, shared_readers={"e1"})["e2"] == PrefixMatch(0, 0, 0)


def test_only_a_prefix_counts():
    index = BlockIndex()
    index.apply("e1", batch(stored(HASHES[:2] + HASHES[3:8])), now=NOW)  # block 2 missing
    assert index.match(HASHES, ["e1"], now=NOW)["e1"] == PrefixMatch(2, 0, 0)
    index.apply("e1", batch(stored(HASHES[2:3])), now=NOW)
    assert index.match(HASHES, ["e1"], now=NOW)["e1"] == PrefixMatch(8, 0, 0)
    # A block on the device after one in a lower tier counts as lower (the prefix needs a load by then).
    index.apply("e1", batch(stored(HASHES[1:2], "DISK"), BlockRemoved(HASHES[1:2], "CPU")), now=NOW)
    assert index.match(HASHES, ["e1"], now=NOW)["e1"] == PrefixMatch(1, 7, 0)


def test_expired_entries_are_ignored_and_pruned():
    index = BlockIndex()
    index.apply("e1", batch(stored(HASHES[:4], expires_at=NOW + 10), stored(HASHES[:2], "HOST", NOW + 100)), now=NOW)
    assert index.match(HASHES, ["e1"], now=NOW + 5)["e1"] == PrefixMatch(4, 0, 0)
    assert index.match(HASHES, ["e1"], now=NOW + 50)["e1"] == PrefixMatch(0, 2, 0)  # device copies expired
    assert len(index) == 3  # block 2 pruned when the walk met it (and stopped); block 3 not reached yet
    assert index.match(HASHES, ["e1"], now=NOW + 500)["e1"] == PrefixMatch(0, 0, 0)
    assert len(index) == 2  # block 0 pruned by that walk
    # A store that arrives already expired is not recorded; one without expiry (vLLM) never expires.
    index.apply("e2", batch(stored(HASHES[:1], expires_at=NOW - 1), engine="e2"), now=NOW)
    assert index.match(HASHES, ["e2"], now=NOW)["e2"].total == 0
    index.apply("e2", batch(stored(HASHES[:1], expires_at=None), engine="e2"), now=NOW)
    assert index.match(HASHES, ["e2"], now=NOW + 1e12)["e2"].total == 1


def test_removal_of_one_copy_keeps_the_other():
    index = BlockIndex()
    index.apply("e1", batch(stored(HASHES[:3]), stored(HASHES[:3], "HOST")), now=NOW)
    index.apply("e1", batch(BlockRemoved(HASHES[:3], "CPU")), now=NOW)
    assert index.match(HASHES, ["e1"], now=NOW)["e1"] == PrefixMatch(0, 3, 0)
    index.apply("e1", batch(BlockRemoved(HASHES[1:2], "HOST")), now=NOW)
    assert index.match(HASHES, ["e1"], now=NOW)["e1"] == PrefixMatch(0, 1, 0)
    index.apply("e1", batch(BlockRemoved(HASHES[:1], None)), now=NOW)  # no medium: every copy
    assert index.match(HASHES, ["e1"], now=NOW)["e1"] == PrefixMatch(0, 0, 0)
    assert len(index) == 1  # block 2's host copy


def test_cleared_and_forgotten_engines_keep_other_engines_and_the_shared_tier():
    index = BlockIndex()
    index.apply("e1", batch(stored(HASHES[:2]), stored(HASHES[2:4], "REMOTE")), now=NOW)
    index.apply("e2", batch(stored(HASHES[:2]), engine="e2"), now=NOW)
    index.apply("e1", batch(AllBlocksCleared()), now=NOW)
    assert index.match(HASHES, ["e1", "e2"], now=NOW) == {"e1": PrefixMatch(0, 0, 0), "e2": PrefixMatch(2, 0, 2)}
    index.forget_engine("e2")
    assert index.match(HASHES, ["e2"], now=NOW)["e2"] == PrefixMatch(0, 0, 0)
    assert index.engines() == []
    assert len(index) == 2  # the shared blocks


def test_snapshot_replaces_an_engines_entries():
    index = BlockIndex()
    index.apply("e1", batch(stored(HASHES[:6])), now=NOW)
    index.apply("e2", batch(stored(HASHES[:6]), engine="e2"), now=NOW)
    snapshot = KVSnapshot(
        engine_id="e1",
        seq=9,
        blocks=[
            SnapshotBlock(HASHES[0].hex(), "CPU", NOW + 60),
            SnapshotBlock(HASHES[1].hex(), "HOST", NOW + 60),
            SnapshotBlock(HASHES[2].hex(), "CPU", NOW - 1),  # expired: skipped
            SnapshotBlock("not hex", "CPU", NOW + 60),  # malformed: skipped, not fatal
        ],
    )
    index.replace_engine("e1", snapshot, now=NOW)
    assert index.match(HASHES, ["e1", "e2"], now=NOW) == {"e1": PrefixMatch(1, 1, 0), "e2": PrefixMatch(6, 0, 0)}


def test_insert_routed_remembers_for_the_ttl():
    index = BlockIndex()
    index.insert_routed("e1", HASHES[:5], 300, now=NOW)
    index.insert_routed("e2", HASHES[:5], 0, now=NOW)  # nothing cached: nothing remembered
    assert index.match(HASHES, ["e1", "e2"], now=NOW + 299) == {"e1": PrefixMatch(5, 0, 0), "e2": PrefixMatch(0, 0, 0)}
    assert index.match(HASHES, ["e1"], now=NOW + 301)["e1"] == PrefixMatch(0, 0, 0)


def test_memory_is_bounded_oldest_first():
    index = BlockIndex(max_entries=6)
    index.insert_routed("e1", HASHES[:4], 300, now=NOW)
    index.insert_routed("e2", HASHES[:2], 300, now=NOW)  # refreshes blocks 0-1: now the newest
    assert len(index) == 6
    index.insert_routed("e3", HASHES[4:6], 300, now=NOW)
    assert len(index) <= 6
    matches = index.match(HASHES, ["e1", "e2"], now=NOW)
    assert matches["e2"] == PrefixMatch(2, 0, 0)  # kept: refreshed last
    assert matches["e1"] == PrefixMatch(2, 0, 0)  # its blocks 2-3 were the oldest
    assert index.match(HASHES[4:], ["e3"], now=NOW)["e3"] == PrefixMatch(2, 0, 0)


def test_expired_shared_blocks_are_ignored_and_pruned():
    index = BlockIndex()
    index.apply("e1", batch(stored(HASHES[:2], "REMOTE", NOW + 10)), now=NOW)
    assert index.match(HASHES, ["e2"], now=NOW + 5)["e2"] == PrefixMatch(0, 0, 2)
    assert len(index) == 2
    assert index.match(HASHES, ["e2"], now=NOW + 11)["e2"] == PrefixMatch(0, 0, 0)
    assert len(index) == 1  # the first, met by the walk
