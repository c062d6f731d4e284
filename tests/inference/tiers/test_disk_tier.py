"""The disk tier alone: records round-trip, the index survives a restart, damage is never loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from inference.clock import ManualClock
from inference.tiers.disk_format import PAGE
from inference.tiers.disk_tier import DiskTier, DiskTierLockedError
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import TierEntry

LAYOUT = BlockLayout((2, 2, 16, 2, 8), torch.float32)  # 4 KiB blocks
T0 = 1_000_000.0


def block_bytes(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, LAYOUT.nbytes, dtype=np.uint8)


def put(tier: DiskTier, entry: TierEntry, payload: np.ndarray) -> np.ndarray:
    """Write a block as the offload worker does: from a page-aligned record buffer. Returns the record."""
    raw = np.zeros(tier.record_size + PAGE, dtype=np.uint8)
    record = raw[-raw.ctypes.data % PAGE :][: tier.record_size]
    record[tier.payload_offset : tier.payload_offset + LAYOUT.nbytes] = payload
    tier.write(entry, record)
    return record


def meta(i: int, *, ttl: int = 300, last_used: float = T0) -> TierEntry:
    return TierEntry(
        block_hash=b"h%03d" % i,
        token_ids=tuple(range(i, i + 16)),
        ttl_s=ttl,
        expires_at=last_used + ttl,
        last_used=last_used,
    )


def open_tier(root: Path, capacity: int = 8, clock: ManualClock | None = None, **kw) -> DiskTier:
    return DiskTier(root, LAYOUT, capacity, clock=clock or ManualClock(T0), pin_min_ttl_s=3600, pin_share=0.5, **kw)


def read(tier: DiskTier, i: int) -> np.ndarray | None:
    entry = tier.lookup(b"h%03d" % i, tuple(range(i, i + 16)), tier.clock.now())
    if entry is None:
        return None
    out = np.empty(LAYOUT.nbytes, dtype=np.uint8)
    assert tier.lock([entry])
    ok = tier.read(entry, out)
    tier.unlock([entry], bad=[] if ok else [entry])
    return out if ok else None


def test_blocks_round_trip_and_the_index_is_rebuilt_after_a_restart(tmp_path):
    tier = open_tier(tmp_path, segment_bytes=2 * 8192)  # 2 records a segment
    for i in range(5):
        put(tier, meta(i, last_used=T0 + i), block_bytes(i))
    assert np.array_equal(read(tier, 3), block_bytes(3))
    assert read(tier, 7) is None
    tier.close()
    assert len(list(tier.dir.glob("seg-*.kvs"))) == 3

    again = open_tier(tmp_path, segment_bytes=2 * 8192)
    assert len(again) == 5
    for i in range(5):
        assert np.array_equal(read(again, i), block_bytes(i))
    # LRU order comes back from the stored last use (block 3 was read, but reads are not persisted).
    assert [e.block_hash for e in again.index.lru_order()] == [b"h%03d" % i for i in range(5)]
    again.close()


def test_one_engine_per_directory(tmp_path):
    tier = open_tier(tmp_path)
    with pytest.raises(DiskTierLockedError):
        open_tier(tmp_path)
    tier.close()
    open_tier(tmp_path).close()


def test_a_flipped_payload_byte_fails_its_checksum_and_the_block_is_dropped(tmp_path):
    tier = open_tier(tmp_path)
    put(tier, meta(0), block_bytes(0))
    put(tier, meta(1), block_bytes(1))
    entry = tier.index.get(b"h001")
    path, offset = tier.dir / "seg-000000.kvs", entry.slot * tier.record_size + 4096 + 100
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert read(tier, 1) is None
    assert tier.stats.checksum_failures == 1 and b"h001" not in tier
    assert np.array_equal(read(tier, 0), block_bytes(0))  # its neighbour is fine
    tier.close()
    again = open_tier(tmp_path)
    assert len(again) == 1  # the bad record's header was cleared: it is not indexed again
    again.close()


def test_a_damaged_header_is_not_indexed_at_start_up(tmp_path):
    tier = open_tier(tmp_path)
    for i in range(3):
        put(tier, meta(i), block_bytes(i))
    slot = tier.index.get(b"h002").slot
    tier.close()
    with open(tier.dir / "seg-000000.kvs", "r+b") as f:
        f.seek(slot * tier.record_size + 40)  # inside the hash field
        f.write(b"\x00\x01")
    again = open_tier(tmp_path)
    assert b"h002" not in again and len(again) == 2
    again.close()


@pytest.mark.parametrize("landed", ["none", "header", "payload", "header and half the payload", "all"])
def test_a_record_torn_by_a_crash_never_loads_wrong_data(tmp_path, landed):
    """Overwrite slot 0 in place and crash with only some of the new record's pages on disk."""
    tier = open_tier(tmp_path, capacity=1)
    old = put(tier, meta(0), block_bytes(0)).copy()
    tier.index.remove(tier.index.get(b"h000"))  # make room without touching the file
    tier._free_slots.append(0)
    new = put(tier, meta(1), block_bytes(1)).copy()
    tier.close()
    half = tier.payload_offset + LAYOUT.nbytes // 2
    torn = {
        "none": old,
        "header": np.concatenate([new[:PAGE], old[PAGE:]]),
        "payload": np.concatenate([old[:PAGE], new[PAGE:]]),
        "header and half the payload": np.concatenate([new[:half], old[half:]]),
        "all": new,
    }[landed]
    (tier.dir / "seg-000000.kvs").write_bytes(torn.tobytes())
    again = open_tier(tmp_path, capacity=1)
    got = {i: read(again, i) for i in (0, 1)}
    again.close()
    if landed == "none":
        assert np.array_equal(got[0], block_bytes(0)) and got[1] is None
    elif landed == "all":
        assert np.array_equal(got[1], block_bytes(1)) and got[0] is None
    else:  # a mix: nothing loads
        assert got == {0: None, 1: None}


def test_capacity_holds_and_the_lru_entry_is_overwritten(tmp_path):
    tier = open_tier(tmp_path, capacity=4)
    for i in range(10):
        put(tier, meta(i), block_bytes(i))
        assert len(tier) <= 4
    assert {e.block_hash for e in tier.index} == {b"h006", b"h007", b"h008", b"h009"}
    assert tier.stats.evictions == 6
    assert sum(p.stat().st_size for p in tier.dir.glob("seg-*.kvs")) <= 4 * tier.record_size
    for i in range(6, 10):
        assert np.array_equal(read(tier, i), block_bytes(i))
    tier.close()


def test_a_locked_entry_is_not_overwritten_and_a_full_locked_tier_drops_the_store(tmp_path):
    tier = open_tier(tmp_path, capacity=1)
    put(tier, meta(0), block_bytes(0))
    entry = tier.index.get(b"h000")
    assert tier.lock([entry])
    put(tier, meta(1), block_bytes(1))
    assert tier.stats.dropped_stores == 1 and b"h001" not in tier
    tier.unlock([entry])
    put(tier, meta(1), block_bytes(1))
    assert b"h001" in tier and b"h000" not in tier
    tier.close()


def test_expired_records_are_purged_at_start_up_and_expired_entries_never_hit(tmp_path):
    clock = ManualClock(T0)
    tier = open_tier(tmp_path, clock=clock)
    put(tier, meta(0, ttl=300), block_bytes(0))
    put(tier, meta(1, ttl=3600), block_bytes(1))
    clock.advance(301)
    assert read(tier, 0) is None and read(tier, 1) is not None
    put(tier, meta(2, ttl=300), block_bytes(2))  # expires at T0 + 300 as well
    tier.close()
    again = open_tier(tmp_path, clock=clock)
    assert again.num_purged_at_start == 1 and {e.block_hash for e in again.index} == {b"h001"}
    again.close()


def test_other_layouts_live_in_other_directories(tmp_path):
    tier = open_tier(tmp_path)
    put(tier, meta(0), block_bytes(0))
    tier.close()
    bf16 = DiskTier(
        tmp_path, BlockLayout(LAYOUT.shape, torch.bfloat16), 8, clock=ManualClock(T0), pin_min_ttl_s=3600, pin_share=0.5
    )
    assert len(bf16) == 0 and bf16.dir != tier.dir
    bf16.close()


def test_a_smaller_capacity_drops_the_records_beyond_it(tmp_path):
    tier = open_tier(tmp_path, capacity=8, segment_bytes=2 * 8192)
    for i in range(8):
        put(tier, meta(i), block_bytes(i))
    tier.close()
    small = open_tier(tmp_path, capacity=3, segment_bytes=2 * 8192)
    assert len(small) <= 3 and len(list(small.dir.glob("seg-*.kvs"))) == 2
    assert sum(p.stat().st_size for p in small.dir.glob("seg-*.kvs")) <= 3 * small.record_size
    for e in list(small.index):
        i = int(e.block_hash[1:])
        assert np.array_equal(read(small, i), block_bytes(i))
    small.close()
