"""A prompt's blocks as keyed hashes: what the cache-explanation index (gateway.cache_block_index) keeps.

Blocks are the engine's (`block_size` tokens, full blocks only, never the block of the last
prompt token, which the engine always recomputes), so a position here is a block the engine
could have read. Two hashes per block, XXH3-128 seeded from the tenant's fingerprint key
(gateway.cache_fingerprints.tenant_key): fast enough to run on every request, and they are kept
only in this process's memory, so a seeded non-cryptographic hash is enough to keep tenants
apart. No token is kept:

- `chain[i]` covers blocks 0..i (parent-chained like the engine's hashes, but without the cache
  salt: the partition is kept beside it, so a prompt cached under another `cache_salt` is
  recognised as such instead of looking new);
- `content[i]` covers block i alone, to see the same tokens come back at the same offset after an
  earlier block changed: the signature of a timestamp near the top of a prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash


@dataclass(frozen=True)
class PromptBlocks:
    block_size: int
    chain: tuple[bytes, ...]
    content: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.chain)


def tenant_seed(key: bytes) -> int:
    """The 64-bit XXH3 seed of a tenant's fingerprint key."""
    return int.from_bytes(key[:8], "little")


def prompt_blocks(token_ids: Sequence[int], *, block_size: int, seed: int) -> PromptBlocks:
    usable = max(len(token_ids) - 1, 0) // block_size
    data = np.asarray(token_ids[: usable * block_size], dtype="<u4").tobytes()
    step = block_size * 4
    digest = xxhash.xxh3_128_digest
    content = [digest(data[start : start + step], seed) for start in range(0, len(data), step)]
    chain: list[bytes] = []
    parent = b""
    for block in content:
        parent = digest(parent + block, seed)
        chain.append(parent)
    return PromptBlocks(block_size, tuple(chain), tuple(content))
