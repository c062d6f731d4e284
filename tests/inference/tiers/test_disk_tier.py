"""The disk tier alone: records round-trip, the index survives a restart, damage is never loaded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from inference.clock import ManualClock
from inference.tiers.disk_format import header_size
from inference.tiers.disk_tier import DiskTier, DiskTierLockedError
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import TierEntry

LAYOUT = BlockLayout((2, 2, 16, 2, 8), torch.float32)  # 4 KiB blocks
T0 = 1_000_000.0


def block_bytes(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, LAYOUT.nbytes, dtype=np.uint8)


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
        tier.write(meta(i, last_used=T0 + i), block_bytes(i))
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
    tier.write(meta(0), block_bytes(0))
    tier.write(meta(1), block_bytes(1))
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
        tier.write(meta(i), block_bytes(i))
    slot = tier.index.get(b"h002").slot
    tier.close()
    with open(tier.dir / "seg-000000.kvs", "r+b") as f:
        f.seek(slot * tier.record_size + 40)  # inside the hash field
        f.write(b"\x00\x01")
    again = open_tier(tmp_path)
    assert b"h002" not in again and len(again) == 2
    again.close()


@pytest.mark.parametrize("torn_at", ["after_clear", "after_payload"])
def test_a_write_torn_by_a_crash_never_loads(tmp_path, torn_at):
    """Overwrite slot 0 in place and stop part-way: neither the old nor a mixed block may load."""
    tier = open_tier(tmp_path, capacity=1)
    tier.write(meta(0), block_bytes(0))
    fd, offset = tier._locate(0)
    os.pwrite(fd, bytes(header_size(16)), offset)  # step 1: the header is cleared
    if torn_at == "after_payload":
        os.pwrite(fd, block_bytes(9).tobytes(), offset + 4096)  # step 2: the new payload; no header yet
    tier.close()
    again = open_tier(tmp_path, capacity=1)
    assert len(again) == 0
    again.close()


def test_a_stale_header_over_a_new_payload_fails_its_checksum(tmp_path):
    """The other torn order (the OS wrote the payload but not the cleared header): caught on load."""
    tier = open_tier(tmp_path, capacity=1)
    tier.write(meta(0), block_bytes(0))
    fd, offset = tier._locate(0)
    os.pwrite(fd, block_bytes(9).tobytes(), offset + 4096)
    tier.close()
    again = open_tier(tmp_path, capacity=1)
    assert len(again) == 1 and read(again, 0) is None and again.stats.checksum_failures == 1
    again.close()


def test_capacity_holds_and_the_lru_entry_is_overwritten(tmp_path):
    tier = open_tier(tmp_path, capacity=4)
    for i in range(10):
        tier.write(meta(i), block_bytes(i))
        assert len(tier) <= 4
    assert {e.block_hash for e in tier.index} == {b"h006", b"h007", b"h008", b"h009"}
    assert tier.stats.evictions == 6
    assert sum(p.stat().st_size for p in tier.dir.glob("seg-*.kvs")) <= 4 * tier.record_size
    for i in range(6, 10):
        assert np.array_equal(read(tier, i), block_bytes(i))
    tier.close()


def test_a_locked_entry_is_not_overwritten_and_a_full_locked_tier_drops_the_store(tmp_path):
    tier = open_tier(tmp_path, capacity=1)
    tier.write(meta(0), block_bytes(0))
    entry = tier.index.get(b"h000")
    assert tier.lock([entry])
    tier.write(meta(1), block_bytes(1))
    assert tier.stats.dropped_stores == 1 and b"h001" not in tier
    tier.unlock([entry])
    tier.write(meta(1), block_bytes(1))
    assert b"h001" in tier and b"h000" not in tier
    tier.close()


def test_expired_records_are_purged_at_start_up_and_expired_entries_never_hit(tmp_path):
    clock = ManualClock(T0)
    tier = open_tier(tmp_path, clock=clock)
    tier.write(meta(0, ttl=300), block_bytes(0))
    tier.write(meta(1, ttl=3600), block_bytes(1))
    clock.advance(301)
    assert read(tier, 0) is None and read(tier, 1) is not None
    tier.write(meta(2, ttl=300), block_bytes(2))  # expires at T0 + 300 as well
    tier.close()
    again = open_tier(tmp_path, clock=clock)
    assert again.num_purged_at_start == 1 and {e.block_hash for e in again.index} == {b"h001"}
    again.close()


def test_other_layouts_live_in_other_directories(tmp_path):
    tier = open_tier(tmp_path)
    tier.write(meta(0), block_bytes(0))
    tier.close()
    bf16 = DiskTier(
        tmp_path, BlockLayout(LAYOUT.shape, torch.bfloat16), 8, clock=ManualClock(T0), pin_min_ttl_s=3600, pin_share=0.5
    )
    assert len(bf16) == 0 and bf16.dir != tier.dir
    bf16.close()


def test_a_smaller_capacity_drops_the_records_beyond_it(tmp_path):
    tier = open_tier(tmp_path, capacity=8, segment_bytes=2 * 8192)
    for i in range(8):
        tier.write(meta(i), block_bytes(i))
    tier.close()
    small = open_tier(tmp_path, capacity=3, segment_bytes=2 * 8192)
    assert len(small) <= 3 and len(list(small.dir.glob("seg-*.kvs"))) == 2
    assert sum(p.stat().st_size for p in small.dir.glob("seg-*.kvs")) <= 3 * small.record_size
    for e in list(small.index):
        i = int(e.block_hash[1:])
        assert np.array_equal(read(small, i), block_bytes(i))
    small.close()
