"""The engine's own forward of llama-family models (llama, qwen2, mistral): the fully fused decoder stack, run
without transformers' module plumbing.

A decode step of SmolLM2 ran ~2,600 tensor ops, a third of them in transformers' layer and
model forwards (keyword plumbing, mask and output bookkeeping, [1, T, ...] views) rather
than in the computation, which at a few rows costs as much as the matmuls. Where
`fuse_decoder_layers` swapped every layer's norms, attention and MLP, `fused_forward` runs
the same modules and ops in the same order as LlamaModel.forward and LlamaDecoderLayer.forward
(embedding, rotary tables, then per layer: norm, attention, residual add, norm, MLP,
residual add; then the final norm), each residual add in one C pass with the norm after it,
so its output is bit-identical to theirs (tests/inference/test_fused_forward.py).
"""

from __future__ import annotations

import torch

from inference.fused_ops import FusedAttention, FusedMLP, FusedRMSNorm
from inference.paged_attention import AttentionBatch


def can_run_fused(model: torch.nn.Module) -> bool:
    """Whether every layer of the model is fused (and so fused_forward applies)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not isinstance(getattr(inner, "norm", None), FusedRMSNorm):
        return False
    return all(
        isinstance(layer.self_attn, FusedAttention)
        and isinstance(layer.mlp, FusedMLP)
        and isinstance(layer.input_layernorm, FusedRMSNorm)
        and isinstance(layer.post_attention_layernorm, FusedRMSNorm)
        for layer in layers
    )


def fused_forward(
    model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, batch: AttentionBatch
) -> torch.Tensor:
    """input_ids, position_ids [1, T] -> the last hidden states [T, hidden]."""
    inner = model.model
    embedded = inner.embed_tokens(input_ids)
    cos, sin = inner.rotary_emb(embedded, position_ids=position_ids)
    cos, sin = cos[0], sin[0]
    hidden = embedded[0]
    layers = inner.layers[: inner.config.num_hidden_layers]
    x = layers[0].input_layernorm(hidden)
    for i, layer in enumerate(layers):
        # Each residual add runs with the norm after it (FusedOps.add_rmsnorm: the same bits in one pass).
        hidden, x = _add_norm(hidden, layer.self_attn.attend_rows(x, cos, sin, batch), layer.post_attention_layernorm)
        after = layers[i + 1].input_layernorm if i + 1 < len(layers) else inner.norm
        hidden, x = _add_norm(hidden, layer.mlp(x), after)
    return x


def _add_norm(hidden: torch.Tensor, delta: torch.Tensor, norm: FusedRMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
    return norm.ops.add_rmsnorm(hidden, delta, norm.weight, norm.eps)
