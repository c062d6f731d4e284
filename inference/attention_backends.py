"""Attention backends: the ways a pass attends over the paged KV pool, behind one interface.

The kernel plan's `attention` (inference/platform.py) names the backend; ModelRunner builds it
once (`backend_for`) and hands it, with the step's metadata from `prepare`, to every layer in
AttentionBatch. The model writes each layer's new keys and values into the pool, then calls
`attend` (inference/paged_attention.py).

  - CpuPagedBackend (plan "cpu_paged"): our C kernel, one call per layer for every row of the
    step, reading the pool in place. It is a hybrid backend in the mini-sglang sense: the
    step's leading decode rows take the kernel's decode-row loop, prompt rows its tile loop,
    and the choice follows the row's kind (RowLayout.num_decode), never the batch.
  - TorchSdpaBackend (plan "torch_sdpa"): gathers each sequence's context and runs torch's
    SDPA (CUDA for now, or CPUs without a C compiler); not batch-invariant.
  - "cuda_paged" is the CUDA backend's place (platform.ATTENTION_CUDA): no class yet.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from inference.cpu_attention import CpuPagedAttention, RowLayout
from inference.paged_attention import SeqSlice
from inference.platform import ATTENTION_CPU, ATTENTION_CUDA, ATTENTION_TORCH

if TYPE_CHECKING:
    from inference.kernels import Kernels
    from inference.model_runner import Chunk
    from inference.paged_attention import AttentionBatch, KVTensors


class AttentionBackend(ABC):
    name: ClassVar[str]
    # Whether a row's output depends on that row alone (then batches and cache hits are exact).
    batch_invariant: ClassVar[bool]

    @abstractmethod
    def prepare(
        self, chunks: Sequence[Chunk], row_seq: list[int], positions: list[int], num_decode: int, device: torch.device
    ) -> Any:
        """The step's metadata, shared by every layer (rows in the order the runner packed them)."""

    @abstractmethod
    def attend(
        self,
        batch: AttentionBatch,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """query [1, H, T, D], the new key/value [1, KVH, T, D] (already in the pool) -> [T, H, D]."""


class CpuPagedBackend(AttentionBackend):
    name = ATTENTION_CPU
    batch_invariant = True

    def __init__(self, kernel: CpuPagedAttention) -> None:
        self.kernel = kernel

    def prepare(
        self, chunks: Sequence[Chunk], row_seq: list[int], positions: list[int], num_decode: int, device: torch.device
    ) -> RowLayout:
        # One tensor per field, built from Python lists in one call each (not one per chunk).
        width = max(len(c.block_ids) for c in chunks)
        tables = [list(c.block_ids) + [0] * (width - len(c.block_ids)) for c in chunks]
        return RowLayout(
            row_seq=torch.tensor(row_seq, dtype=torch.int32),
            row_pos=torch.tensor(positions, dtype=torch.int32),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            num_decode=num_decode,
        )

    @staticmethod
    def pad_single_row(rows: RowLayout) -> RowLayout:
        """A lone prompt row's layout run as two rows, the copy attending as position 0 (see ModelRunner)."""
        row_pos = torch.tensor([int(rows.row_pos[0]), 0], dtype=torch.int32)
        return RowLayout(rows.row_seq.repeat(2), row_pos, rows.block_tables)

    def attend(
        self,
        batch: AttentionBatch,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        return self.attend_rows(batch, layer, query[0].transpose(0, 1), scale)

    def attend_rows(self, batch: AttentionBatch, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        """q [T, H, D] (unit stride on D) -> [T, H, D]: the fused forward's call, without transformers' views."""
        k_pool, v_pool = batch.kv.layer_pools[layer]
        return self.kernel(q, k_pool, v_pool, batch.meta, scale)


class TorchSdpaBackend(AttentionBackend):
    name = ATTENTION_TORCH
    batch_invariant = False

    def prepare(
        self, chunks: Sequence[Chunk], row_seq: list[int], positions: list[int], num_decode: int, device: torch.device
    ) -> tuple[SeqSlice, ...]:
        seqs, q = [], 0
        for chunk in chunks:
            n = len(chunk.token_ids)
            block_ids = torch.tensor(chunk.block_ids, dtype=torch.long, device=device)
            seqs.append(SeqSlice(q_start=q, q_end=q + n, pos_start=chunk.start, block_ids=block_ids))
            q += n
        return tuple(seqs)

    def attend(
        self,
        batch: AttentionBatch,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        kv = batch.kv
        out = query.new_empty(query.shape[2], query.shape[1], query.shape[3])
        on_cpu = query.device.type == "cpu"
        for seq in batch.meta:
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
        return out


def backend_for(kernels: Kernels) -> AttentionBackend:
    """The backend the plan names, over the kernels it loaded."""
    name = kernels.plan.attention
    if name == ATTENTION_CPU:
        assert kernels.attention is not None, "the plan names the CPU kernel, which load_kernels loads"
        return CpuPagedBackend(kernels.attention)
    if name == ATTENTION_TORCH:
        return TorchSdpaBackend()
    assert name != ATTENTION_CUDA, "the CUDA backend is not built yet, so the plan never names it"
    raise ValueError(f"no attention backend {name!r}")


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
