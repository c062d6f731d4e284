"""What one KV block is in memory: every layer's K and V for block_size tokens, as one unit.

The device pool is one tensor [num_layers, 2, num_blocks, block_size, kv_heads, head_dim],
so a block is the strided view cache[:, :, block_id]. The lower tiers store it
contiguously as [num_layers, 2, block_size, kv_heads, head_dim]: one copy, one disk
record, one checksum per block (vLLM's CPU tier keeps the same unit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xxhash

# Bump when the meaning of a stored block changes, so old disk records stop matching. That
# includes a change of the numbers the engine computes (2: the lane-wise attention kernel and
# the fused ops): a block computed by the old code would make warm output differ from cold.
LAYOUT_VERSION = 2


@dataclass(frozen=True)
class BlockLayout:
    shape: tuple[int, ...]  # (num_layers, 2, block_size, kv_heads, head_dim)
    dtype: torch.dtype
    # What computed the blocks: the engine's kernel plan digest (inference/platform.py), so a disk
    # tier written under one plan is never read under another.
    compute: str = ""

    @classmethod
    def of_pool(cls, cache: torch.Tensor, compute: str = "") -> BlockLayout:
        layers, kv, _, block_size, heads, head_dim = cache.shape
        return cls((layers, kv, block_size, heads, head_dim), cache.dtype, compute)

    @property
    def block_size(self) -> int:
        return self.shape[2]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for dim in self.shape:
            n *= dim
        return n

    @property
    def fingerprint(self) -> str:
        """Names this layout on disk: blocks of another dtype, shape or kernel plan never load here."""
        key = f"kvgate-kv/v{LAYOUT_VERSION}|{self.dtype}|{'x'.join(map(str, self.shape))}"
        if self.compute:
            key += f"|{self.compute}"
        return xxhash.xxh3_64_hexdigest(key.encode())

    def typed(self, raw: torch.Tensor) -> torch.Tensor:
        """A flat uint8 buffer of nbytes seen as one block of this layout (no copy)."""
        assert raw.dtype == torch.uint8 and raw.numel() == self.nbytes and raw.is_contiguous()
        return raw.view(self.dtype).view(self.shape)


def device_block(cache: torch.Tensor, block_id: int) -> torch.Tensor:
    """Block block_id of the device pool, across all layers (a strided view)."""
    return cache[:, :, block_id]
