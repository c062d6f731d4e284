"""Paged KV storage and the attention function that plugs it into transformers models.

The model runs with config._attn_implementation = "kvgate_paged". Each decoder layer
computes q/k/v (with RoPE) as usual and calls `paged_attention`, which writes the new
k/v into the block pool and attends over each sequence's whole context read back from
the pool. Tokens of several sequences are packed along one batch row; `AttentionBatch`
says where each sequence's queries sit and which blocks hold its context.

The attention itself is the kernel plan's backend (inference/attention_backends.py): on
CPU our C kernel, one call per layer for the whole batch, reading the pool in place, and
batch-invariant, so a row's output never depends on how its prompt was chunked or what
ran beside it; elsewhere (CUDA, or without a C compiler) torch's SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import AttentionInterface

if TYPE_CHECKING:
    from inference.attention_backends import AttentionBackend

ATTN_IMPLEMENTATION = "kvgate_paged"


class KVTensors:
    """K and V of every layer, allocated once: cache[layer, 0|1] is [num_blocks, block_size, kv_heads, head_dim]."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.cache = torch.zeros(
            num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device
        )
        # Each layer's K and V pools and their one-row-per-slot views, made once: every layer of
        # every step reads them, and slicing them anew cost six tensor ops per layer.
        self.layer_pools = [(self.cache[i, 0], self.cache[i, 1]) for i in range(num_layers)]
        self._flat = [
            (k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim)) for k, v in self.layer_pools
        ]

    @staticmethod
    def bytes_per_block(
        *, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return num_layers * 2 * block_size * num_kv_heads * head_dim * dtype.itemsize

    @property
    def num_blocks(self) -> int:
        return self.cache.shape[2]

    def flat(self, layer: int, kv: int) -> torch.Tensor:
        """[num_blocks * block_size, kv_heads, head_dim]: one row per token slot."""
        return self._flat[layer][kv]


@dataclass(frozen=True)
class SeqSlice:
    """One sequence's part of a packed batch: queries [q_start, q_end) at positions [pos_start, pos_end)."""

    q_start: int
    q_end: int
    pos_start: int
    block_ids: torch.Tensor  # blocks holding positions [0, pos_end)

    @property
    def num_queries(self) -> int:
        return self.q_end - self.q_start

    @property
    def pos_end(self) -> int:
        return self.pos_start + self.num_queries


@dataclass(frozen=True)
class AttentionBatch:
    kv: KVTensors
    slot_mapping: torch.Tensor  # [num_tokens] pool slot of each new token
    backend: AttentionBackend  # the plan's (inference/attention_backends.py)
    meta: Any  # the step's metadata from backend.prepare: RowLayout, or the torch backend's SeqSlices


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    kv_batch: AttentionBatch | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: query [1, H, T, D], key/value [1, KVH, T, D] -> [1, T, H, D]."""
    assert kv_batch is not None, "the kvgate model runner passes kv_batch to every forward"
    layer = module.layer_idx
    kv = kv_batch.kv
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    new_k = key[0].transpose(0, 1)
    new_v = value[0].transpose(0, 1)
    written = kv_batch.slot_mapping.shape[0]
    if written != new_k.shape[0]:  # a padded pass (ModelRunner): only the real rows write
        new_k, new_v = new_k[:written], new_v[:written]
    flat_k, flat_v = kv._flat[layer]
    flat_k.index_copy_(0, kv_batch.slot_mapping, new_k)
    flat_v.index_copy_(0, kv_batch.slot_mapping, new_v)
    out = kv_batch.backend.attend(kv_batch, layer, query, key, value, scale)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
