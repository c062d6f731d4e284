"""Paged KV storage and the attention function that plugs it into transformers models.

The model runs with config._attn_implementation = "kvgate_paged". Each decoder layer
computes q/k/v (with RoPE) as usual and calls `paged_attention`, which writes the new
k/v into the block pool and attends over each sequence's whole context read back from
the pool. Tokens of several sequences are packed along one batch row; `AttentionBatch`
says where each sequence's queries sit and which blocks hold its context.

On CPU the attention itself is our C kernel (cpu_attention.py): one call per layer for
the whole batch, reading the pool in place, and batch-invariant, so a row's output
never depends on how its prompt was chunked or what ran beside it. Elsewhere (CUDA, or
without a C compiler) torch's SDPA kernels do it, gathering each sequence's context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from inference.cpu_attention import CpuPagedAttention, RowLayout

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
    seqs: tuple[SeqSlice, ...]
    # With the CPU kernel: one call per layer for every row of the batch.
    cpu_kernel: CpuPagedAttention | None = None
    rows: RowLayout | None = None


def _context(kv: KVTensors, layer: int, seq: SeqSlice, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions [0, length) as [1, kv_heads, length, head_dim], gathered block-wise."""
    ids = seq.block_ids[: -(-length // kv.block_size)]
    k = kv.cache[layer, 0].index_select(0, ids).flatten(0, 1)[:length]
    v = kv.cache[layer, 1].index_select(0, ids).flatten(0, 1)[:length]
    return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)


def _attend_cpu(q: torch.Tensor, k_prefix, v_prefix, k_new, v_new, scale: float) -> torch.Tensor:
    """Causal attention of new queries over [prefix, new] keys, exact block skipping.

    The prefix part needs no mask and the new part is plain causal, so each runs in
    the fused CPU flash kernel and the two are merged by their log-sum-exps.
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_new, lse_new = flash(q, k_new, v_new, 0.0, True, scale=scale)
    if k_prefix is None:
        return out_new
    out_pre, lse_pre = flash(q, k_prefix, v_prefix, 0.0, False, scale=scale)
    lse = torch.logaddexp(lse_pre, lse_new)
    w_pre = torch.exp(lse_pre - lse).unsqueeze(-1)
    w_new = torch.exp(lse_new - lse).unsqueeze(-1)
    return (out_pre.float() * w_pre + out_new.float() * w_new).to(q.dtype)


def _attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """The same attention for any device: one SDPA call with a bottom-right causal mask."""
    n, total = q.shape[2], k.shape[2]
    rows = torch.arange(n, device=q.device).unsqueeze(1) + prefix
    mask = torch.arange(total, device=q.device).unsqueeze(0) <= rows
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


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
    if kv_batch.cpu_kernel is not None:
        assert kv_batch.rows is not None
        q = query[0].transpose(0, 1)
        k_pool, v_pool = kv.layer_pools[layer]
        out = kv_batch.cpu_kernel(q, k_pool, v_pool, kv_batch.rows, scale)
        return out.unsqueeze(0), None

    out = query.new_empty(query.shape[2], query.shape[1], query.shape[3])
    on_cpu = query.device.type == "cpu"
    for seq in kv_batch.seqs:
        q = query[:, :, seq.q_start : seq.q_end]
        if seq.num_queries == 1 and seq.pos_start > 0:
            # A decode step: one query attends to everything, its own fresh k/v included.
            k, v = _context(kv, layer, seq, seq.pos_end)
            o = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        elif on_cpu:
            k_new = key[:, :, seq.q_start : seq.q_end]
            v_new = value[:, :, seq.q_start : seq.q_end]
            k_pre = v_pre = None
            if seq.pos_start > 0:
                k_pre, v_pre = _context(kv, layer, seq, seq.pos_start)
            o = _attend_cpu(q, k_pre, v_pre, k_new, v_new, scale)
        else:
            k, v = _context(kv, layer, seq, seq.pos_end)
            o = _attend_masked(q, k, v, seq.pos_start, scale)
        out[seq.q_start : seq.q_end] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
