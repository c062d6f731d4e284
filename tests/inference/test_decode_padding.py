"""A single oneDNN row runs padded to two rows (ModelRunner): its logits and KV must be the unpadded ones."""

from __future__ import annotations

import random

import pytest
import torch

from inference.engine import Engine
from inference.types import SamplingParams
from tests.inference.helpers import checked, random_prompt

ONEDNN_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def decode_logits(engine: Engine, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    seen: list[torch.Tensor] = []
    engine.logits_observer = lambda ids, logits: seen.append(logits.clone())
    out = checked(engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)))
    engine.logits_observer = None
    return list(out.token_ids), seen


@pytest.mark.skipif(not ONEDNN_BF16, reason="packed bf16 linears (and so the padding) need oneDNN's bf16 path")
def test_a_padded_single_row_gives_the_unpadded_logits_and_kv(make_engine, tiny_llama_dir):
    # Decode rows on oneDNN, as on CPUs without the decode kernel (which takes lone rows unpadded).
    padded = make_engine(tiny_llama_dir, dtype="bfloat16", decode_linear="onednn")
    plain = make_engine(tiny_llama_dir, dtype="bfloat16", decode_linear="onednn")
    assert padded.runner.pad_single_row and plain.runner.cpu_kernel is not None
    plain.runner.pad_single_row = False  # each packed linear pads the lone row itself, as before
    prompt = random_prompt(random.Random(31), 40)
    tokens, logits = decode_logits(padded, prompt)
    plain_tokens, plain_logits = decode_logits(plain, prompt)
    assert tokens == plain_tokens
    assert len(logits) == 12 and all(torch.equal(a, b) for a, b in zip(logits, plain_logits, strict=True))
    # The padding row writes no KV: both pools hold exactly the same bytes.
    assert torch.equal(padded.kv_tensors.cache, plain.kv_tensors.cache)
    # The comparison can fail: another prompt's logits and KV differ.
    _, other = decode_logits(plain, random_prompt(random.Random(32), 40))
    assert not torch.equal(other[0], logits[0])
    assert not torch.equal(padded.kv_tensors.cache, plain.kv_tensors.cache)
