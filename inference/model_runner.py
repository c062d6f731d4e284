"""Runs one packed forward pass of a transformers model over the paged KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from inference.attention_backends import CpuPagedBackend, backend_for
from inference.cpu_linear import pack_linears
from inference.decode_linear import use_decode_kernel
from inference.exact_blocks import BlockWeight, find_blocks
from inference.fused_ops import fuse_decoder_layers
from inference.kernels import Kernels
from inference.models.llama import can_run_fused, fused_forward
from inference.paged_attention import ATTN_IMPLEMENTATION, AttentionBatch, KVTensors


@dataclass(frozen=True)
class Chunk:
    """Positions [start, end) of one sequence to compute, with their token ids and pool slots.

    block_ids cover positions [0, end); sample says whether the last position's logits are needed.
    Positions from num_prompt_tokens on hold generated tokens: decode rows (None: all are prompt rows).
    """

    token_ids: Sequence[int]
    start: int
    slots: Sequence[int]
    block_ids: Sequence[int]
    sample: bool
    num_prompt_tokens: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


RESCORE = 8  # top logits recomputed in float32 per sampled row


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv: KVTensors, kernels: Kernels) -> None:
        """kernels: the engine's kernel plan and the C kernels it loaded (inference/kernels.py)."""
        self.model = model
        self.kv = kv
        self.plan = kernels.plan
        self.device = next(model.parameters()).device
        cpu_kernel = self.cpu_kernel = kernels.attention
        self.attention = backend_for(kernels)
        decode_kernel = kernels.decode
        _use_paged_attention(model)
        # Kept unpacked: the rescoring of the top logits below reads rows of it.
        self.lm_weight = _lm_head_weight(model)
        # Before packing: the fused q/k/v and gate/up projections are packed like the others.
        fuse_decoder_layers(model, kernels.fused)
        # Decode rows through our kernel, where the plan has one (only with the CPU attention
        # kernel, whose rows may come in any order).
        self.decode_rows = None
        # The LM head's weight as the decode kernel reads it; None: decode rows' logits as prompt rows'.
        self.lm_decode_weight: torch.Tensor | BlockWeight | None = None
        self.decode_format = _DECODE_FORMATS.get(self.plan.decode_linear)
        if self.decode_format is not None and cpu_kernel is not None and self.lm_weight is not None:
            self.decode_rows = use_decode_kernel(model, decode_kernel)
        if self.decode_rows is not None:
            if not hasattr(model, "kvgate_lm_decode_weight"):
                model.kvgate_lm_decode_weight = (
                    decode_kernel.pack(self.lm_weight) if self.decode_format == "bf16" else find_blocks(self.lm_weight)
                )
            self.lm_decode_weight = model.kvgate_lm_decode_weight
        self.decode_kernel = decode_kernel if self.decode_rows is not None else None
        packed = pack_linears(model, kernels.amx) > 0 or getattr(model, "kvgate_packed", False)
        model.kvgate_packed = packed  # a second runner over the same model finds nothing left to pack
        # Single-row passes padded once per pass, for packed linears under the CPU kernel (whose
        # rows carry their own sequence and position, so a duplicate row is well-defined).
        self.pad_single_row = packed and cpu_kernel is not None
        # Every layer fused and the CPU kernel attending: the stack runs without transformers' plumbing.
        self.fused_forward = self.plan.fused_forward and can_run_fused(model)

    @torch.inference_mode()
    def execute(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Compute the chunks' KV into the pool; return float32 logits for the chunks that sample."""
        if self.decode_kernel is None:
            return self._execute(chunks)
        self.decode_kernel.begin_pass(self.decode_format)
        try:
            return self._execute(chunks)
        finally:
            self.decode_kernel.end_pass()

    def _execute(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        dev = self.device
        plan = _plan_rows(chunks, split_decode=self.decode_rows is not None)
        ids, positions, num_rows = plan.ids, plan.positions, len(plan.ids)
        meta = self.attention.prepare(chunks, plan.row_seq, positions, plan.num_decode, dev)
        if num_rows == 1 and self.pad_single_row and plan.num_decode == 0:
            # A lone prompt row runs as two rows: every packed linear would otherwise pad it
            # with a zero row itself (see PackedLinear), four more ops per linear; this pads it
            # once for the whole pass. Row 0 is unchanged: rows never depend on each other. Only
            # row 0 writes its KV (slot_mapping has one entry), and the copy attends as position
            # 0 (one key) rather than over the whole context again. (A lone decode row needs no
            # padding: the decode kernel takes any number of rows.)
            ids, positions = ids * 2, positions * 2
            meta = CpuPagedBackend.pad_single_row(meta)
        batch = AttentionBatch(
            kv=self.kv,
            slot_mapping=torch.tensor(plan.slots, dtype=torch.long, device=dev),
            backend=self.attention,
            meta=meta,
        )
        if self.decode_rows is not None:
            self.decode_rows.count = plan.num_decode
        input_ids = torch.tensor([ids], dtype=torch.long, device=dev)
        position_ids = torch.tensor([positions], dtype=torch.long, device=dev)
        try:
            if self.fused_forward:
                hidden = fused_forward(self.model, input_ids, position_ids, batch)
            else:
                hidden = self.model.model(
                    input_ids=input_ids, position_ids=position_ids, use_cache=False, kv_batch=batch
                ).last_hidden_state[0]
        finally:
            if self.decode_rows is not None:
                self.decode_rows.count = 0
        sample_rows, num_decode = plan.sample_rows, plan.num_decode
        if not sample_rows:
            return hidden.new_empty(0, 0, dtype=torch.float32)
        # Only the rows that sample go through the LM head: it is the widest matmul of the model.
        if sample_rows == list(range(num_rows)):  # every decode step: no gather
            if num_decode == num_rows:
                return self._decode_logits(hidden[:num_rows])
            if num_decode == 0:
                # A padded pass hands the LM head both rows too (no pad of its own), keeping the first.
                return self._logits(hidden[:num_rows], head_rows=hidden)
        decode_picks = [i for i, row in enumerate(sample_rows) if row < num_decode]
        if not decode_picks:
            return self._logits(hidden[torch.tensor(sample_rows, dtype=torch.long, device=dev)])
        # A mixed step: each row's logits by its own kind's path, back in chunk order.
        prompt_picks = [i for i, row in enumerate(sample_rows) if row >= num_decode]
        decode = self._decode_logits(hidden[[sample_rows[i] for i in decode_picks]])
        if not prompt_picks:
            return decode
        prompt = self._logits(hidden[[sample_rows[i] for i in prompt_picks]])
        logits = decode.new_empty(len(sample_rows), decode.shape[1])
        logits[decode_picks] = decode
        logits[prompt_picks] = prompt
        return logits

    def _decode_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 logits of decode rows from the decode kernel: float32 sums, never rounded
        to bf16, so no near-tie is decided by rounding and nothing needs rescoring. (A float32
        LM head whose weight is not exact blocks computes them as prompt rows' are.)"""
        bias = getattr(self.model.lm_head, "bias", None)
        if self.lm_decode_weight is None:
            return self._logits(rows)
        if isinstance(self.lm_decode_weight, BlockWeight):
            return self.decode_kernel.blocks_linear(rows.contiguous(), self.lm_decode_weight, bias)
        return self.decode_kernel.linear(
            rows.contiguous(), self.lm_decode_weight, self.lm_weight.shape[0], bias, out_dtype=torch.float32
        )

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


# The decode kernel's weight format for each decode_linear of the plan (inference/platform.py).
_DECODE_FORMATS = {"decode_bf16": "bf16", "exact_blocks": "blocks"}


def _lm_head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    # Kept on the model: packing replaces lm_head by a PackedLinear without a weight, so a second
    # runner over the same loaded model (tests build several) would otherwise find none and skip
    # the rescoring, and give other greedy picks than the first.
    if not hasattr(model, "kvgate_lm_weight"):
        weight = getattr(model.lm_head, "weight", None)
        model.kvgate_lm_weight = weight.detach() if isinstance(weight, torch.Tensor) else None
    return model.kvgate_lm_weight


class RowPlan(NamedTuple):
    """A pass's rows in the order they run: decode rows first (when split), then prompt rows."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    row_seq: list[int]  # the chunk each row belongs to
    sample_rows: list[int]  # the row of each sampling chunk, in chunk order
    num_decode: int


def _plan_rows(chunks: Sequence[Chunk], split_decode: bool) -> RowPlan:
    """Rows in chunk order; with split_decode, every chunk's decode rows (positions from its
    num_prompt_tokens on) are moved ahead of all prompt rows, so the linears see them as one
    leading block. Row order changes no result: every row carries its own sequence and position."""
    kinds: tuple[list[list[int]], list[list[int]]] = ([[], [], [], []], [[], [], [], []])  # decode, prompt
    picks: list[tuple[bool, int]] = []
    for i, chunk in enumerate(chunks):
        n = len(chunk.token_ids)
        cut = n  # rows [0, cut) are prompt rows, [cut, n) decode rows
        if split_decode and chunk.num_prompt_tokens is not None:
            cut = min(n, max(0, chunk.num_prompt_tokens - chunk.start))
        for kind, lo, hi in ((kinds[1], 0, cut), (kinds[0], cut, n)):
            if lo < hi:
                kind[0].extend(chunk.token_ids[lo:hi])
                kind[1].extend(range(chunk.start + lo, chunk.start + hi))
                kind[2].extend(chunk.slots[lo:hi])
                kind[3].extend([i] * (hi - lo))
        if chunk.sample:
            picks.append((cut < n, len(kinds[0 if cut < n else 1][0]) - 1))
    decode, prompt = kinds
    num_decode = len(decode[0])
    sample_rows = [row if is_decode else num_decode + row for is_decode, row in picks]
    ids, positions, slots, row_seq = (d + p for d, p in zip(decode, prompt, strict=True))
    return RowPlan(ids, positions, slots, row_seq, sample_rows, num_decode)


def _use_paged_attention(model: torch.nn.Module) -> None:
    model.config._attn_implementation = ATTN_IMPLEMENTATION
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = ATTN_IMPLEMENTATION
