"""Sealed tier records: Redis and disk hold no readable prompt and accept no forged, damaged or misplaced record.

Every negative check is paired with a positive one: the same prompt, on an engine with
the right key, still reads its blocks from the tier. Redis tests run against the real
Redis at 127.0.0.1:6379 (conftest.shared); each has salts and fingerprints of its own.
"""

from __future__ import annotations

import random
import re
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis

from inference.engine import Engine
from inference.tiers.disk_format import MAGIC, PAGE, RecordHeader, header_size
from inference.tiers.disk_tier import DiskTier
from inference.tiers.sealing import TierKeys
from inference.types import CacheSpec, SamplingParams
from tests.inference.helpers import by_tier, checked
from tests.inference.tiers.helpers import committed_hashes, push_down
from tests.inference.tiers.redis_helpers import redis_tier
from tests.inference.tiers.test_disk_tier import LAYOUT, T0, block_bytes, meta, open_tier, put, read

GREEDY_8 = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
KEY = "test-tier-key-0123456789abcdef"
OTHER_KEY = "another-tier-key-fedcba9876543210"
CODEWORD = "quokkazanzibar"  # a distinctive word: its text must appear in no record
BLOCKS = 9  # full blocks the prompt commits (PROMPT_TOKENS // 16, less the last token's)
PROMPT_TOKENS = 150


def salt() -> str:
    return f"tenant-{uuid.uuid4().hex}"


def codeword_prompt(engine: Engine) -> list[int]:
    """A prompt of PROMPT_TOKENS tokens that says the codeword, then filler text."""
    text = f"The launch codeword is {CODEWORD}. Say {CODEWORD} to the guard at the gate. "
    rng = random.Random(4242)
    words = ["river", "stone", "window", "orange", "cloud", "ladder", "violin", "meadow", "copper", "lantern"]
    while len(engine.tokenizer.encode(text)) < PROMPT_TOKENS:
        text += " ".join(rng.choice(words) for _ in range(8)) + ". "
    return list(engine.tokenizer.encode(text))[:PROMPT_TOKENS]


def needles(engine: Engine, prompt: list[int]) -> list[bytes]:
    """What a plaintext prompt would leave: every 4-token window as int32 and int64 little-endian, and the codeword."""
    found = [CODEWORD.encode(), CODEWORD.upper().encode()]
    for i in range(len(prompt) - 3):
        window = prompt[i : i + 4]
        found += [np.asarray(window, "<i4").tobytes(), np.asarray(window, "<i8").tobytes()]
    assert CODEWORD in engine.tokenizer.decode(prompt)
    return found


def leaks(blob: bytes, prompt_needles: list[bytes]) -> list[bytes]:
    return [n for n in prompt_needles if n in blob]


def printable_runs(blob: bytes, prompt_text: str, length: int = 12) -> list[bytes]:
    """Runs of `length`+ printable characters that also occur in the prompt's text (readable plaintext)."""
    return [r for r in re.findall(rb"[ -~]{%d,}" % length, blob) if r.decode() in prompt_text]


def test_the_leak_checks_find_a_plaintext_prompt(tiny_llama_dir, make_engine):
    """The scans below could fail: they find the prompt in the plaintext the old format held."""
    engine = make_engine(tiny_llama_dir)
    prompt = codeword_prompt(engine)
    text = engine.tokenizer.decode(prompt)
    plain = b"KVGBLK01" + np.asarray(prompt[16:32], "<u4").tobytes() + text.encode()
    assert leaks(plain, needles(engine, prompt)) and printable_runs(plain, text)
    assert not leaks(np.random.default_rng(1).bytes(1 << 16), needles(engine, prompt))


# -- Redis ------------------------------------------------------------------------------------


def scan_values(client: redis.Redis) -> dict[bytes, bytes]:
    """SCAN + GET of every KV tier key in this Redis (any test's: all must be sealed)."""
    values = {}
    for key in client.scan_iter(match="kvg:*", count=1000):
        value = client.get(key)
        if value is not None:
            values[key] = value
    return values


def test_a_redis_scan_finds_no_token_ids_and_no_text_yet_the_prompt_hits(shared, tiny_llama_dir, redis_client):
    a = shared(tiny_llama_dir, kv_tier_key=KEY)
    prompt, spec = codeword_prompt(a), CacheSpec(salt=salt())
    text = a.tokenizer.decode(prompt)
    cold = checked(a.generate(prompt, GREEDY_8, spec))
    a.tiers.flush()
    tier = redis_tier(a)
    ours = {tier.key(h).encode() for h in committed_hashes(a, prompt, spec.salt)}
    values = scan_values(redis_client)
    assert ours <= set(values)  # the scan saw this prompt's records
    for key, value in values.items():
        assert not leaks(key + value, needles(a, prompt)), key
        assert not printable_runs(value, text), key
    for key in ours:  # a key name is the prefix and a keyed hash: nothing of the block hash or the prompt
        assert key.startswith(tier.prefix.encode() + b":") and re.fullmatch(rb"[0-9a-f]{64}", key.rsplit(b":")[-1])
        assert not any(h.hex().encode() in key for h in committed_hashes(a, prompt, spec.salt))
    # Paired positive: another engine with the key reads every block, and outputs what the cold run did.
    b = shared(tiny_llama_dir, kv_tier_key=KEY)
    warm = checked(b.generate(prompt, GREEDY_8, spec))
    assert warm.usage.cached_tokens_by_tier == by_tier(redis=16 * BLOCKS)
    assert warm.token_ids == cold.token_ids


def damage(value: bytes, how: str) -> bytes:
    if how == "header byte":
        return value[:100] + bytes([value[100] ^ 0x01]) + value[101:]
    if how == "payload byte":
        return value[:-50] + bytes([value[-50] ^ 0x80]) + value[-49:]
    if how == "truncated payload":
        return value[: len(value) // 2 + 256]
    assert how == "truncated header"
    return value[:60]


@pytest.mark.parametrize("how", ["header byte", "payload byte", "truncated payload", "truncated header"])
def test_a_damaged_redis_record_is_a_miss_and_a_fresh_record_of_it_hits(shared, tiny_llama_dir, redis_client, how):
    a = shared(tiny_llama_dir, kv_tier_key=KEY)
    prompt, spec = codeword_prompt(a), CacheSpec(salt=salt())
    cold = checked(a.generate(prompt, GREEDY_8, spec))
    a.tiers.flush()
    key = redis_tier(a).key(committed_hashes(a, prompt, spec.salt)[2])
    value = redis_client.get(key)
    assert value is not None
    assert redis_client.set(key, damage(value, how), keepttl=True)

    b = shared(tiny_llama_dir, kv_tier_key=KEY)
    out = checked(b.generate(prompt, GREEDY_8, spec))
    # Blocks 0 and 1 load; block 2 does not open, so the chain stops there: recomputed, never a 500.
    assert out.usage.cached_tokens_by_tier == by_tier(redis=32)
    assert out.token_ids == cold.token_ids
    assert redis_tier(b).stats.checksum_failures == 1
    b.tiers.flush()  # b's recomputed block 2 replaced the damaged record (deleted on failure)
    # Paired positive: the fresh record of that block (and every other) hits.
    c = shared(tiny_llama_dir, kv_tier_key=KEY)
    again = checked(c.generate(prompt, GREEDY_8, spec))
    assert again.usage.cached_tokens_by_tier == by_tier(redis=16 * BLOCKS)
    assert again.token_ids == cold.token_ids and redis_tier(c).stats.checksum_failures == 0


def test_a_record_copied_under_another_tenants_key_is_a_miss(shared, tiny_llama_dir, redis_client):
    a = shared(tiny_llama_dir, kv_tier_key=KEY)
    prompt, alice, mallory = codeword_prompt(a), CacheSpec(salt=salt()), CacheSpec(salt=salt())
    cold = checked(a.generate(prompt, GREEDY_8, alice))
    a.tiers.flush()
    tier = redis_tier(a)
    pairs = zip(committed_hashes(a, prompt, alice.salt), committed_hashes(a, prompt, mallory.salt), strict=True)
    for theirs, mine in pairs:  # Mallory's keys now hold Alice's records, and so does a shifted block of Alice's
        assert redis_client.copy(tier.key(theirs), tier.key(mine))
    hashes = committed_hashes(a, prompt, alice.salt)

    b = shared(tiny_llama_dir, kv_tier_key=KEY)
    out = checked(b.generate(prompt, GREEDY_8, mallory))
    assert out.usage.cached_tokens == 0 and redis_tier(b).stats.loads == 0
    assert redis_tier(b).stats.checksum_failures >= 1
    assert out.token_ids == cold.token_ids
    # Alice's block 1 copied under her block 0's key: bound to its own name, it does not open there either.
    assert redis_client.set(tier.key(hashes[0]), redis_client.get(tier.key(hashes[1])), keepttl=True)
    c = shared(tiny_llama_dir, kv_tier_key=KEY)
    assert checked(c.generate(prompt, GREEDY_8, alice)).usage.cached_tokens == 0
    c.tiers.flush()
    # Paired positive: Alice's own records, rewritten by c, hit on a fresh engine.
    d = shared(tiny_llama_dir, kv_tier_key=KEY)
    warm = checked(d.generate(prompt, GREEDY_8, alice))
    assert warm.usage.cached_tokens_by_tier == by_tier(redis=16 * BLOCKS) and warm.token_ids == cold.token_ids


def test_redis_key_rotation_reads_the_previous_key_only_while_it_is_listed(shared, tiny_llama_dir):
    old = shared(tiny_llama_dir, kv_tier_key=KEY)
    prompt, spec = codeword_prompt(old), CacheSpec(salt=salt())
    cold = checked(old.generate(prompt, GREEDY_8, spec))
    old.tiers.flush()
    # Not listed: the old key's records are misses (they are under other names, and would not open).
    unlisted = shared(tiny_llama_dir, kv_tier_key=OTHER_KEY)
    miss = checked(unlisted.generate(prompt, GREEDY_8, CacheSpec(salt=spec.salt, regions=spec.regions)))
    assert miss.usage.cached_tokens == 0 and miss.token_ids == cold.token_ids
    # Listed as previous: read.
    rotated = shared(tiny_llama_dir, kv_tier_key="a-third-tier-key-00000000000", kv_tier_previous_keys=KEY)
    hit = checked(rotated.generate(prompt, GREEDY_8, spec))
    assert hit.usage.cached_tokens_by_tier == by_tier(redis=16 * BLOCKS) and hit.token_ids == cold.token_ids


# -- disk -------------------------------------------------------------------------------------


def segment_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("seg-*.kvs")))


def test_disk_records_hold_no_token_ids_or_text_yet_survive_a_restart(tiered, tiny_llama_dir, tmp_path):
    engine = tiered(tiny_llama_dir, device=16, disk=64, kv_tier_key=KEY)
    prompt = codeword_prompt(engine)
    text = engine.tokenizer.decode(prompt)
    cold = checked(engine.generate(prompt, GREEDY_8))
    hashes = committed_hashes(engine, prompt)
    push_down(engine, hashes, "disk")
    engine.close()
    blob = segment_bytes(tmp_path / "kv")
    assert blob.count(MAGIC) >= BLOCKS
    assert not leaks(blob, needles(engine, prompt)) and not printable_runs(blob, text)
    assert not any(h in blob for h in hashes)
    # Paired positive: a restart with the key reads the prompt from disk.
    again = tiered(tiny_llama_dir, device=16, disk=64, kv_tier_key=KEY)
    warm = checked(again.generate(prompt, GREEDY_8))
    assert warm.usage.cached_tokens_by_tier == by_tier(disk=16 * BLOCKS) and warm.token_ids == cold.token_ids


def test_disk_key_rotation_and_an_unknown_key(tiered, tiny_llama_dir):
    first = tiered(tiny_llama_dir, device=16, disk=64, kv_tier_key=KEY)
    prompt = codeword_prompt(first)
    cold = checked(first.generate(prompt, GREEDY_8))
    push_down(first, committed_hashes(first, prompt), "disk")
    first.close()
    # Restarted under a new key alone: the old records are misses (not indexed at start-up).
    unlisted = tiered(tiny_llama_dir, device=16, disk=64, kv_tier_key=OTHER_KEY, kv_disk_write_out_on_close=False)
    assert len(unlisted.tiers.tier("disk")) == 0
    miss = checked(unlisted.generate(prompt, GREEDY_8))
    assert miss.usage.cached_tokens == 0 and miss.token_ids == cold.token_ids
    unlisted.close()
    # With the old key listed as previous they are read (the new key's own records of this prompt too).
    rotated = tiered(tiny_llama_dir, device=16, disk=64, kv_tier_key=OTHER_KEY, kv_tier_previous_keys=KEY)
    hit = checked(rotated.generate(prompt, GREEDY_8))
    assert hit.usage.cached_tokens_by_tier == by_tier(disk=16 * BLOCKS) and hit.token_ids == cold.token_ids


def keyed(root: Path, key: str = KEY, previous: tuple[str, ...] = (), **kw) -> DiskTier:
    return open_tier(root, keys=TierKeys(key.encode(), [p.encode() for p in previous]), **kw)


def slot_bytes(tier: DiskTier, slot: int) -> tuple[Path, int]:
    segment, index = divmod(slot, tier.slots_per_segment)
    return tier.dir / f"seg-{segment:06d}.kvs", index * tier.record_size


@pytest.mark.parametrize("where", ["key id", "name", "sealed header", "header tag"])
def test_a_flipped_disk_header_byte_is_not_indexed_and_its_neighbours_are(tmp_path, where):
    tier = keyed(tmp_path)
    for i in range(3):
        put(tier, meta(i), block_bytes(i))
    slot = tier.index.get(b"h001").slot
    tier.close()
    offset = {"key id": 9, "name": 20, "sealed header": 100, "header tag": header_size(LAYOUT.block_size) - 1}[where]
    path, base = slot_bytes(tier, slot)
    with open(path, "r+b") as f:
        f.seek(base + offset)
        byte = f.read(1)[0]
        f.seek(base + offset)
        f.write(bytes([byte ^ 0x04]))
    again = keyed(tmp_path)
    assert b"h001" not in again and read(again, 1) is None
    assert np.array_equal(read(again, 0), block_bytes(0)) and np.array_equal(read(again, 2), block_bytes(2))
    again.close()


def test_a_disk_record_moved_under_another_blocks_name_does_not_open(tmp_path):
    """A's record in B's slot, its clear name rewritten to B's: neither block's key opens it."""
    tier = keyed(tmp_path)
    put(tier, meta(0), block_bytes(0))
    put(tier, meta(1), block_bytes(1))
    slots = {i: tier.index.get(b"h%03d" % i).slot for i in (0, 1)}
    tier.close()
    path, a_at = slot_bytes(tier, slots[0])
    _, b_at = slot_bytes(tier, slots[1])
    data = bytearray(path.read_bytes())
    record_a = bytes(data[a_at : a_at + tier.record_size])
    b_name = bytes(data[b_at + 12 : b_at + 44])
    forged = record_a[:12] + b_name + record_a[44:]
    data[b_at : b_at + tier.record_size] = forged
    path.write_bytes(bytes(data))
    again = keyed(tmp_path)
    assert read(again, 1) is None  # B's lookup finds nothing: the forged header did not open
    assert np.array_equal(read(again, 0), block_bytes(0))  # paired positive: A's own record still opens
    again.close()
    # And A's payload under B's header (each sealed to its own block) fails at load, never reads A's bytes.
    tier = keyed(tmp_path)
    put(tier, meta(1), block_bytes(1))
    slot_b = tier.index.get(b"h001").slot
    tier.close()
    path, b_at = slot_bytes(tier, slot_b)
    data = bytearray(path.read_bytes())
    data[b_at + PAGE : b_at + PAGE + LAYOUT.nbytes] = record_a[PAGE : PAGE + LAYOUT.nbytes]
    path.write_bytes(bytes(data))
    again = keyed(tmp_path)
    assert b"h001" in again and read(again, 1) is None and again.stats.checksum_failures == 1
    assert np.array_equal(read(again, 0), block_bytes(0))
    again.close()


def test_a_truncated_segment_loses_only_the_records_it_cut(tmp_path):
    tier = keyed(tmp_path, capacity=4)
    for i in range(3):
        put(tier, meta(i), block_bytes(i))
    cut = tier.index.get(b"h002").slot
    tier.close()
    path, base = slot_bytes(tier, cut)
    with open(path, "r+b") as f:
        f.truncate(base + PAGE + LAYOUT.nbytes // 2)  # the last record's header, half its payload
    again = keyed(tmp_path, capacity=4)
    assert read(again, 2) is None
    assert all(np.array_equal(read(again, i), block_bytes(i)) for i in (0, 1))
    again.close()


def test_disk_rotation_at_the_tier_level(tmp_path):
    tier = keyed(tmp_path)
    put(tier, meta(0), block_bytes(0))
    tier.close()
    unknown = keyed(tmp_path, OTHER_KEY)
    assert len(unknown) == 0 and read(unknown, 0) is None  # an unknown key id: a miss
    unknown.close()
    rotated = keyed(tmp_path, OTHER_KEY, previous=(KEY,))
    assert np.array_equal(read(rotated, 0), block_bytes(0))
    put(rotated, meta(1), block_bytes(1))  # new records go under the current key
    rotated.close()
    done = keyed(tmp_path, OTHER_KEY)  # the old key dropped: only what the new key sealed is read
    assert read(done, 0) is None and np.array_equal(read(done, 1), block_bytes(1))
    done.close()


def test_headers_of_the_plaintext_format_and_of_other_keys_are_misses():
    keys = TierKeys(KEY.encode())
    header = RecordHeader(1, b"h000", 300, T0, T0 + 300, LAYOUT.nbytes, tuple(range(16)), key_id=keys.current_id)
    sealed = header.pack(keys)
    assert RecordHeader.unpack(sealed, block_size=16, keys=keys) == header
    assert RecordHeader.unpack(b"KVGBLK01" + sealed[8:], block_size=16, keys=keys) is None
    assert RecordHeader.unpack(sealed, block_size=16, keys=TierKeys(OTHER_KEY.encode())) is None
    assert RecordHeader.unpack(sealed[:-1], block_size=16, keys=keys) is None
