"""Chained block hashes: deterministic across processes, salted on the first block.

hash(block i) = H(parent hash || extra keys || token ids). The first block's extra keys
carry the model id and the cache salt; every later block inherits both through its
parent hash, so two salts never share a block and neither does an unsalted request.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Literal

import numpy as np
import xxhash

BlockHash = bytes
HashAlgo = Literal["sha256", "xxhash128"]

# The parent of the first block: a fixed value (vLLM seeds it randomly per process; we
# need the same hash in every process for the disk tier and for routing).
ROOT_PARENT = b"kvgate/root/v1"


def _encode_str(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    data = value.encode()
    return b"\x01" + struct.pack("<I", len(data)) + data


class BlockHasher:
    """Computes the chain of full-block hashes of a token sequence."""

    def __init__(self, *, model_id: str, block_size: int, algo: HashAlgo = "sha256") -> None:
        self.block_size = block_size
        self.algo = algo
        self._model_key = _encode_str(model_id)

    def digest(self, data: bytes) -> BlockHash:
        if self.algo == "sha256":
            return hashlib.sha256(data).digest()
        return xxhash.xxh3_128_digest(data)

    def hash_block(self, parent: BlockHash | None, token_ids: Sequence[int], salt: str | None) -> BlockHash:
        extra = self._model_key + (_encode_str(salt) if parent is None else b"")
        tokens = np.asarray(token_ids, dtype="<u4").tobytes()
        return self.digest((parent or ROOT_PARENT) + extra + tokens)

    def hash_blocks(
        self, token_ids: Sequence[int], salt: str | None, *, start: int = 0, parent: BlockHash | None = None
    ) -> list[BlockHash]:
        """Hashes of the full blocks of token_ids from block index `start`, chained on `parent`."""
        bs = self.block_size
        hashes: list[BlockHash] = []
        for i in range(start, len(token_ids) // bs):
            parent = self.hash_block(parent, token_ids[i * bs : (i + 1) * bs], salt)
            hashes.append(parent)
        return hashes
