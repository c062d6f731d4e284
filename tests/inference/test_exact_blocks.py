"""Float32 weights read back as exact GGUF blocks (exact_blocks.py) and the decode kernel's loop over them."""

from __future__ import annotations

import random

import pytest
import torch

from inference.decode_linear import BlockDecodeLinear, DecodeKernel
from inference.exact_blocks import Q4_1, Q8_0, BlockWeight, find_blocks
from inference.settings import EngineSettings
from inference.types import CacheSpec, SamplingParams
from tests.inference.helpers import best_kernel_variant, checked, random_prompt
from tests.model_fixtures import quantize_q4_1, quantize_q8_0

VARIANT = best_kernel_variant("decode_linear")
KERNEL = None if VARIANT is None else DecodeKernel.load(EngineSettings().cache_dir, VARIANT)
needs_blocks = pytest.mark.skipif(KERNEL is None or not KERNEL.blocks, reason="the blocks kernel needs AVX2 and FMA")


def weight(n: int, k: int, fmt: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    raw = torch.randn(n, k) * 0.05
    return quantize_q4_1(raw) if fmt == Q4_1 else quantize_q8_0(raw)


@needs_blocks
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0])
@pytest.mark.parametrize(("n", "k"), [(96, 576), (7, 32), (300, 1536)])
def test_blocks_give_back_every_weight_bit_for_bit(fmt, n, k):
    w = weight(n, k, fmt)
    blocks = find_blocks(w)
    assert blocks is not None and blocks.format == fmt
    assert blocks.packed.shape == (n, k // 32, 24 if fmt == Q4_1 else 36)
    assert torch.equal(KERNEL.unpack_blocks(blocks), w)
    # The check can fail: the same blocks with one scale changed give other weights.
    changed = blocks.packed.clone()
    changed[0, 0, 0] ^= 1
    assert not torch.equal(KERNEL.unpack_blocks(blocks._replace(packed=changed)), w)


def test_weights_that_are_not_exact_blocks_keep_their_float32_path():
    w = weight(64, 128, Q4_1)
    assert find_blocks(w) is not None
    nudged = w.clone()
    nudged[3, 77] = torch.nextafter(nudged[3, 77], torch.tensor(1.0))  # one weight off by one float32 step
    assert find_blocks(nudged) is None
    assert find_blocks(torch.randn(64, 128)) is None  # plain float32 weights
    assert find_blocks(w[:, :100].contiguous()) is None  # inputs not a multiple of 32
    assert find_blocks(w.to(torch.bfloat16)) is None
    assert find_blocks(torch.zeros(4, 64)).format == Q4_1  # constant blocks: d = 0


@needs_blocks
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0])
@pytest.mark.parametrize("bias", [False, True])
def test_blocks_linear_matches_float64_matmul(fmt, bias):
    w = weight(960, 576, fmt)
    blocks = find_blocks(w)
    b = torch.randn(960) if bias else None
    x = torch.randn(5, 576)
    out = KERNEL.blocks_linear(x, blocks, b)
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    assert out.dtype == torch.float32 and out.shape == (5, 960)
    torch.testing.assert_close(out.double(), exact, atol=1e-5, rtol=1e-5)
    # The check can fail: another weight gives other outputs.
    other = KERNEL.blocks_linear(x, find_blocks(weight(960, 576, fmt, seed=9)), b)
    assert not torch.allclose(other, out, atol=1e-3)


@needs_blocks
@pytest.mark.parametrize(("n", "k", "fmt"), [(1536, 576, Q4_1), (576, 1536, Q4_1), (49152, 576, Q8_0)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_row_alone_equals_the_row_in_any_batch(n, k, fmt, threads):
    blocks = find_blocks(weight(n, k, fmt, seed=1))
    x = torch.randn(24, k) * 4
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = [KERNEL.blocks_linear(x[i : i + 1], blocks) for i in range(24)]
        for rows in range(2, 17):
            start = rows % 5
            batch = KERNEL.blocks_linear(x[start : start + rows], blocks)
            for i in range(rows):
                assert torch.equal(batch[i], alone[start + i][0]), (rows, i)
        wide = torch.cat([x, x], dim=1)[:, :k]  # rows with a stride give the same bits too
        assert torch.equal(KERNEL.blocks_linear(wide[3:11], blocks), torch.cat(alone[3:11]))
    finally:
        torch.set_num_threads(old)


def decode_logits(engine, prompt: list[int]) -> torch.Tensor:
    """The float32 logits the second sampled token came from (the first decode row's)."""
    seen: list[torch.Tensor] = []
    engine.logits_observer = lambda ids, logits: seen.append(logits[0].clone())
    checked(engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), CacheSpec(salt="x")))
    engine.logits_observer = None
    return seen[1]


@needs_blocks
def test_the_engine_serves_decode_rows_of_a_quantized_float32_model_from_its_blocks(
    make_engine, tiny_llama_q4_1_dir, tiny_llama_dir
):
    engine = make_engine(tiny_llama_q4_1_dir)
    layers = engine.runner.model.model.layers
    assert engine.runner.decode_rows is not None
    assert all(isinstance(layer.mlp.down_proj, BlockDecodeLinear) for layer in layers)
    assert all(isinstance(layer.self_attn.qkv_proj, BlockDecodeLinear) for layer in layers)
    head = engine.runner.lm_decode_weight
    assert isinstance(head, BlockWeight) and head.format == Q8_0
    # Told not to, or a float32 model whose weights are not blocks: every row on the float32 path.
    assert make_engine(tiny_llama_q4_1_dir, decode_linear="onednn").runner.decode_rows is None
    assert make_engine(tiny_llama_dir).runner.decode_rows is None

    rng = random.Random(7)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = [random_prompt(rng, rng.randrange(20, 70)) for _ in range(6)]
    # A decode row's logits: the same weights as the float32 path's, summed in another order.
    plain = make_engine(tiny_llama_q4_1_dir, decode_linear="onednn")
    second = [decode_logits(e, prompts[0]) for e in (engine, plain)]
    torch.testing.assert_close(second[0], second[1], atol=1e-4, rtol=1e-4)
    solo = [checked(engine.generate(p, params)).token_ids for p in prompts]
    assert len(set(solo)) == len(prompts)
    warm = [checked(engine.generate(p, params)) for p in prompts]
    assert all(w.usage.cached_tokens > 0 for w in warm) and [w.token_ids for w in warm] == solo
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}", p, params, CacheSpec(salt="cold"))
    batched: dict[str, tuple[int, ...]] = {}
    while engine.has_unfinished():
        batched.update({o.request_id: checked(o.finished).token_ids for o in engine.step() if o.finished})
    assert [batched[f"b{i}"] for i in range(len(prompts))] == solo
