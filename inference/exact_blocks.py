"""Float32 weights that are exactly GGUF blocks (Q4_1 or Q8_0), found and packed for the decode kernel.

A GGUF model runs in float32 on CPUs without avx512_bf16, and a decode step then reads 4 bytes
per weight. But each of its weights was dequantized by the loader as float32 d * q + m (Q4_1:
q in 0..15, d and m float16) or d * q (Q8_0: q in -127..127), 32 inputs of an output per block.
Read back as blocks, a step reads 0.75 (Q4_1) or 1.125 (Q8_0) bytes per weight instead.

The blocks are found from the float32 values alone and kept only where every weight of the
tensor comes back bit for bit from them (a multiply, then an add, in float32, as the loader and
csrc/decode_linear.c compute it), so the kernel multiplies by the very weights the model holds.
Any other tensor, say a model loaded from safetensors, gives None and keeps its float32 path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BLOCK = 32
Q4_1, Q8_0 = 1, 2  # the formats of csrc/decode_linear.c


class BlockWeight(NamedTuple):
    """A [out_features, in_features] weight as the kernel reads it: uint8 [N, K / 32, 24 (Q4_1) or 36 (Q8_0)]."""

    format: int
    packed: torch.Tensor
    out_features: int
    in_features: int


def find_blocks(weight: torch.Tensor) -> BlockWeight | None:
    """The weight as exact Q4_1 or Q8_0 blocks, or None where it is not exactly either."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % BLOCK or weight.numel() == 0:
        return None
    n, k = weight.shape
    blocks = weight.detach().reshape(n, k // BLOCK, BLOCK)
    with torch.inference_mode():
        for fmt, pack in ((Q4_1, _q4_1), (Q8_0, _q8_0)):
            packed = pack(blocks)
            if packed is not None:
                return BlockWeight(fmt, packed, n, k)
    return None


def _q4_1(blocks: torch.Tensor) -> torch.Tensor | None:
    # The block's smallest weight is its m (its q is 0), so m is a float16 value.
    m = blocks.amin(-1, keepdim=True)
    if not torch.equal(m.half().float(), m):
        return None
    fit = _fit_scale(blocks, (blocks.amax(-1, keepdim=True) - m) / 15, offset=m, lo=0, hi=15)
    if fit is None:
        return None
    d, q = fit
    q = q.to(torch.uint8)
    nibbles = q[..., :16] | (q[..., 16:] << 4)  # GGUF's order: byte j holds q[j] and q[j + 16]
    return torch.cat([_bytes(d), _bytes(m), nibbles], dim=-1).contiguous()


def _q8_0(blocks: torch.Tensor) -> torch.Tensor | None:
    fit = _fit_scale(blocks, blocks.abs().amax(-1, keepdim=True) / 127, offset=None, lo=-127, hi=127)
    if fit is None:
        return None
    d, q = fit
    return torch.cat([_bytes(d), q.to(torch.int8).view(torch.uint8)], dim=-1).contiguous()


def _fit_scale(
    blocks: torch.Tensor, estimate: torch.Tensor, *, offset: torch.Tensor | None, lo: int, hi: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per block, a float16 scale d (the estimate rounded, or a neighbour) and integers q in
    [lo, hi] with float32 d * q (+ offset) equal to every weight; None if some block has none."""
    shifted = blocks if offset is None else blocks - offset
    d = estimate.half().float()
    q, ok = _try_scale(blocks, shifted, d, offset, lo, hi)
    if bool(ok.all()):
        return d, q
    # The rounded estimate misses by a float16 step in a few blocks: try its neighbours there.
    miss = (~ok).reshape(-1).nonzero().squeeze(1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    sub_blocks, sub_shifted = flat(blocks)[miss], flat(shifted)[miss]
    sub_offset = None if offset is None else flat(offset)[miss]
    base = flat(d)[miss].half()
    sub_d, sub_q = flat(d)[miss].clone(), flat(q)[miss].clone()
    found = torch.zeros_like(sub_d, dtype=torch.bool)
    for toward in (float("inf"), 0.0):
        c = torch.nextafter(base, torch.full_like(base, toward)).float()
        qc, okc = _try_scale(sub_blocks, sub_shifted, c, sub_offset, lo, hi)
        okc &= ~found
        sub_d, sub_q, found = torch.where(okc, c, sub_d), torch.where(okc, qc, sub_q), found | okc
    if not bool(found.all()):
        return None
    flat(d)[miss], flat(q)[miss] = sub_d, sub_q
    return d, q


def _try_scale(
    blocks: torch.Tensor, shifted: torch.Tensor, d: torch.Tensor, offset: torch.Tensor | None, lo: int, hi: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q for scale d, and per block whether d * q (+ offset) gives back every weight."""
    q = torch.where(d > 0, shifted / d, 0).round_().clamp_(lo, hi)
    rebuilt = d * q if offset is None else d * q + offset
    return q, (rebuilt == blocks).all(-1, keepdim=True)


def _bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 [..., 1] -> its 4 bytes, uint8 [..., 4]."""
    return values.contiguous().view(torch.uint8)
