"""Runs one packed forward pass of a transformers model over the paged KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.cpu_attention import CpuPagedAttention, RowLayout
from inference.cpu_linear import pack_linears
from inference.fused_ops import FusedOps, fuse_decoder_layers
from inference.paged_attention import ATTN_IMPLEMENTATION, AttentionBatch, KVTensors, SeqSlice


@dataclass(frozen=True)
class Chunk:
    """Positions [start, end) of one sequence to compute, with their token ids and pool slots.

    block_ids cover positions [0, end); sample says whether the last position's logits are needed.
    """

    token_ids: Sequence[int]
    start: int
    slots: Sequence[int]
    block_ids: Sequence[int]
    sample: bool

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


RESCORE = 8  # top logits recomputed in float32 per sampled row


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv: KVTensors,
        cpu_kernel: CpuPagedAttention | None = None,
        fused_ops: FusedOps | None = None,
    ) -> None:
        self.model = model
        self.kv = kv
        self.device = next(model.parameters()).device
        self.cpu_kernel = cpu_kernel
        _use_paged_attention(model)
        # Kept unpacked: the rescoring of the top logits below reads rows of it.
        self.lm_weight = _lm_head_weight(model)
        # Before packing: the fused q/k/v and gate/up projections are packed like the others.
        fuse_decoder_layers(model, fused_ops)
        packed = pack_linears(model) > 0 or getattr(model, "kvgate_packed", False)
        model.kvgate_packed = packed  # a second runner over the same model finds nothing left to pack
        # Single-row passes padded once per pass, for packed linears under the CPU kernel (whose
        # rows carry their own sequence and position, so a duplicate row is well-defined).
        self.pad_single_row = packed and cpu_kernel is not None

    @torch.inference_mode()
    def execute(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Compute the chunks' KV into the pool; return float32 logits for the chunks that sample."""
        dev = self.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        for chunk in chunks:
            ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start, chunk.end))
            slots.extend(chunk.slots)
            if chunk.sample:
                sample_rows.append(len(ids) - 1)
        num_rows = len(ids)
        rows = _row_layout(chunks, positions) if self.cpu_kernel is not None else None
        if num_rows == 1 and self.pad_single_row:
            # A lone row (one stream decoding) runs as two rows: every packed linear would
            # otherwise pad it with a zero row itself (see PackedLinear), four more ops per
            # linear; this pads it once for the whole pass. Row 0 is unchanged: rows never
            # depend on each other. Only row 0 writes its KV (slot_mapping has one entry), and
            # the copy attends as position 0 (one key) rather than over the whole context again.
            ids, positions = ids * 2, positions * 2
            row_pos = torch.tensor([positions[0], 0], dtype=torch.int32)
            rows = RowLayout(rows.row_seq.repeat(2), row_pos, rows.block_tables)
        batch = AttentionBatch(
            kv=self.kv,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            seqs=_seq_slices(chunks, dev) if self.cpu_kernel is None else (),
            cpu_kernel=self.cpu_kernel,
            rows=rows,
        )
        hidden = self.model.model(
            input_ids=torch.tensor([ids], dtype=torch.long, device=dev),
            position_ids=torch.tensor([positions], dtype=torch.long, device=dev),
            use_cache=False,
            kv_batch=batch,
        ).last_hidden_state[0]
        if not sample_rows:
            return hidden.new_empty(0, 0, dtype=torch.float32)
        # Only the rows that sample go through the LM head: it is the widest matmul of the model.
        if sample_rows == list(range(num_rows)):  # every decode step: no gather
            # A padded pass hands the LM head both rows too (no pad of its own), keeping the first.
            return self._logits(hidden[:num_rows], head_rows=hidden)
        return self._logits(hidden[torch.tensor(sample_rows, dtype=torch.long, device=dev)])

    def _logits(self, rows: torch.Tensor, head_rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits. In bf16/fp16 the LM head rounds its outputs to a step of ~0.1 at
        typical magnitudes, so near-ties between the top tokens are decided by rounding; the
        RESCORE top candidates are recomputed in float32 from the same inputs (row by row,
        so batching cannot change them), and greedy picks by those exact scores.

        head_rows: rows to run the LM head on, of which `rows` are the first (a padded pass)."""
        head_rows = rows if head_rows is None else head_rows
        logits = self.model.lm_head(head_rows)[: rows.shape[0]].float()
        if rows.dtype == torch.float32 or self.lm_weight is None:
            return logits
        k = min(RESCORE, logits.shape[-1])
        top = logits.topk(k, dim=-1).indices
        exact = (rows.float().unsqueeze(1) * self.lm_weight[top].float()).sum(-1)
        bias = getattr(self.model.lm_head, "bias", None)
        if bias is not None:
            exact += bias[top].float()
        return logits.scatter_(1, top, exact)


def _lm_head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    # Kept on the model: packing replaces lm_head by a PackedLinear without a weight, so a second
    # runner over the same loaded model (tests build several) would otherwise find none and skip
    # the rescoring, and give other greedy picks than the first.
    if not hasattr(model, "kvgate_lm_weight"):
        weight = getattr(model.lm_head, "weight", None)
        model.kvgate_lm_weight = weight.detach() if isinstance(weight, torch.Tensor) else None
    return model.kvgate_lm_weight


def _row_layout(chunks: Sequence[Chunk], positions: list[int]) -> RowLayout:
    # One tensor per field, built from Python lists in one call each (not one per chunk).
    width = max(len(c.block_ids) for c in chunks)
    tables = [list(c.block_ids) + [0] * (width - len(c.block_ids)) for c in chunks]
    row_seq = [i for i, chunk in enumerate(chunks) for _ in range(len(chunk.token_ids))]
    return RowLayout(
        row_seq=torch.tensor(row_seq, dtype=torch.int32),
        row_pos=torch.tensor(positions, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
    )


def _seq_slices(chunks: Sequence[Chunk], device: torch.device) -> tuple[SeqSlice, ...]:
    """Per-sequence metadata for the torch attention path (the CPU kernel reads RowLayout instead)."""
    seqs, q = [], 0
    for chunk in chunks:
        n = len(chunk.token_ids)
        block_ids = torch.tensor(chunk.block_ids, dtype=torch.long, device=device)
        seqs.append(SeqSlice(q_start=q, q_end=q + n, pos_start=chunk.start, block_ids=block_ids))
        q += n
    return tuple(seqs)


def _use_paged_attention(model: torch.nn.Module) -> None:
    model.config._attn_implementation = ATTN_IMPLEMENTATION
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = ATTN_IMPLEMENTATION
