"""fused_forward: the fused decoder stack without transformers' plumbing gives its exact outputs."""

from __future__ import annotations

import random

import pytest
import torch

from inference.model_runner import Chunk
from tests.inference.helpers import random_prompt


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fused_forward_equals_the_transformers_forward_bit_for_bit(make_engine, tiny_llama_dir, dtype):
    engine = make_engine(tiny_llama_dir, dtype=dtype)
    runner = engine.runner
    if not runner.fused_forward:
        assert dtype == "bfloat16", "float32 models are fused wherever the C library builds"
        pytest.skip("nothing is fused on this CPU (oneDNN has no bf16 path)")
    rng = random.Random(5)
    bs = engine.kv_tensors.block_size
    chunks, next_block = [], 1
    for n, start in ((37, 0), (20, 16), (1, 40)):  # a cold prompt, a warm tail, a single row
        prompt = random_prompt(rng, start + n)
        blocks = list(range(next_block, next_block + -(-(start + n) // bs)))
        next_block += len(blocks)
        slots = [blocks[p // bs] * bs + p % bs for p in range(start, start + n)]
        chunks.append(Chunk(prompt[start:], start, slots, blocks, sample=True))
    fused = runner.execute(chunks)
    runner.fused_forward = False
    plain = runner.execute(chunks)
    runner.fused_forward = True
    assert torch.equal(fused, plain) and fused.abs().sum() > 0
    # Not trivially equal: another prompt gives other logits.
    other = [Chunk([t + 1 for t in chunks[0].token_ids], 0, chunks[0].slots, chunks[0].block_ids, sample=True)]
    assert not torch.equal(runner.execute(other), fused[:1])
