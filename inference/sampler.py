"""Turning last-position logits into next tokens: greedy, or temperature / top-k / top-p with optional seeds."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inference.types import SamplingParams

# Below this temperature sampling is greedy (as in vLLM): dividing logits by it overflows.
SAMPLING_EPS = 1e-5


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < SAMPLING_EPS


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A per-request generator: seeded requests repeat exactly; greedy ones need none."""
    if is_greedy(params):
        return None
    generator = torch.Generator(device=device)
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    return generator


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Scale by temperature and mask everything outside top-k and the top-p nucleus ([vocab] row)."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> list[int]:
    """One token per row of float32 logits [n, vocab]."""
    greedy = logits.argmax(dim=-1).tolist()
    out = []
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if is_greedy(p):
            out.append(greedy[row])
            continue
        probs = torch.softmax(filter_logits(logits[row], p), dim=-1)
        if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
            out.append(greedy[row])  # degenerate parameters must not fail the whole batch
            continue
        out.append(int(torch.multinomial(probs, 1, generator=gen).item()))
    return out
