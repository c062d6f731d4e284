"""The fused decoder-layer ops (csrc/fused_ops.c) against torch's, and the fused model against plain transformers."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from inference.cpu_linear import PackedLinear
from inference.fused_ops import FusedAttention, FusedMLP, FusedOps, FusedRMSNorm, fuse_decoder_layers
from inference.model_loader import load_model
from inference.settings import EngineSettings
from inference.types import SamplingParams
from tests.inference.helpers import best_kernel_variant, checked, planned_amx_linear, random_prompt
from tests.inference.test_engine_exactness import first_logits

ONEDNN_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
needs_onednn_bf16 = pytest.mark.skipif(not ONEDNN_BF16, reason="oneDNN has no bf16 path on this CPU")


@pytest.fixture(scope="module")
def ops() -> FusedOps:
    """The build the kernel plan runs here (a build failure is an error: gcc is part of the machine)."""
    return FusedOps.load(EngineSettings().cache_dir, best_kernel_variant("fused_ops"))


def bf16(*shape: int, scale: float = 1.0, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])


@DTYPES
def test_rotary_is_bit_identical_to_transformers(ops, dtype):
    T, H, KVH, D = 300, 9, 3, 64
    qkv = bf16(T, (H + 2 * KVH) * D, dtype=dtype)
    cos, sin = bf16(T, D, seed=1, dtype=dtype), bf16(T, D, seed=2, dtype=dtype)
    q, k = ops.rotary(qkv, cos, sin, H, KVH, D)
    q_ref = qkv[:, : H * D].view(1, T, H, D).transpose(1, 2)
    k_ref = qkv[:, H * D : (H + KVH) * D].view(1, T, KVH, D).transpose(1, 2)
    q_ref, k_ref = apply_rotary_pos_emb(q_ref, k_ref, cos[None], sin[None])
    assert torch.equal(q, q_ref[0].transpose(0, 1))
    assert torch.equal(k, k_ref[0].transpose(0, 1))
    swapped, _ = ops.rotary(qkv, sin, cos, H, KVH, D)  # the comparison can fail
    assert not torch.equal(swapped, q)


@DTYPES
def test_rotary_to_pool_writes_what_rotary_and_index_copy_would(ops, dtype):
    T, H, KVH, D = 6, 9, 3, 64
    qkv = bf16(T, (H + 2 * KVH) * D, seed=1, dtype=dtype)
    cos, sin = bf16(T, D, seed=2, dtype=dtype), bf16(T, D, seed=3, dtype=dtype)
    k_pool, v_pool = torch.zeros(40, KVH, D, dtype=dtype), torch.zeros(40, KVH, D, dtype=dtype)
    slots = torch.tensor([3, 17, 9, 30, 31], dtype=torch.long)  # 5 of 6 rows write: a padded pass
    q = ops.rotary_to_pool(qkv, cos, sin, (H, KVH, D), k_pool, v_pool, slots)
    q_ref, k_ref = ops.rotary(qkv, cos, sin, H, KVH, D)
    assert torch.equal(q, q_ref)
    assert torch.equal(k_pool[slots], k_ref[:5]) and torch.equal(
        v_pool[slots], qkv[:5, (H + KVH) * D :].view(5, KVH, D)
    )
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[slots] = False
    assert k_pool[untouched].abs().sum() == 0 and v_pool[untouched].abs().sum() == 0
    assert k_pool[slots].abs().sum() > 0


@DTYPES
@pytest.mark.parametrize("width", [576, 40])
def test_rmsnorm_matches_transformers_and_rows_are_independent(ops, width, dtype):
    x = bf16(1, 200, width, scale=3.0, dtype=dtype)
    norm = LlamaRMSNorm(width, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(bf16(width, seed=3, dtype=dtype))
    out = FusedRMSNorm(norm, ops)(x)
    expected = norm(x)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(out, expected, atol=0, rtol=2**-7)  # at most one bf16 step apart
        assert (out == expected).float().mean() > 0.99
    else:  # float32: the sum of squares in another order
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    assert torch.equal(ops.rmsnorm(x[:, 17:18], norm.weight, 1e-5), out[:, 17:18])
    assert torch.equal(ops.rmsnorm(x[:, 5:150], norm.weight, 1e-5), out[:, 5:150])
    assert not torch.equal(ops.rmsnorm(x, norm.weight, 1.0), out)


@DTYPES
@pytest.mark.parametrize("width", [1536, 17])
def test_silu_mul_matches_torch_and_rows_are_independent(ops, width, dtype):
    gu = bf16(1, 100, 2 * width, scale=4.0, dtype=dtype)
    out = ops.silu_mul(gu)
    expected = F.silu(gu[..., :width]) * gu[..., width:]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=2**-7 if dtype == torch.bfloat16 else 1e-6)
    assert torch.equal(ops.silu_mul(gu[:, 9:10]), out[:, 9:10])
    assert not torch.equal(ops.silu_mul(gu.flip(-1)), out)


def test_silu_mul_gives_the_same_bits_in_vector_and_scalar_code(ops):
    """Width 17: lanes 0-15 take the AVX-512 path where there is one, lane 16 the scalar one."""
    values = bf16(64, scale=5.0)
    gu = torch.zeros(64, 34, dtype=torch.bfloat16)
    gu[:, 16], gu[:, 33] = values, values.flip(0)  # scalar lane
    gu[:, 0], gu[:, 17] = values, values.flip(0)  # vector lane
    out = ops.silu_mul(gu)
    assert torch.equal(out[:, 16], out[:, 0])
    assert out[:, 0].abs().sum() > 0


@needs_onednn_bf16
def test_fusing_concatenates_projections_bit_identically_and_only_once(ops, tiny_llama_dir):
    model = load_model(EngineSettings(model=str(tiny_llama_dir), dtype="bfloat16")).model
    layer = model.model.layers[0]
    x = bf16(1, 33, model.config.hidden_size, seed=5)
    with torch.inference_mode():
        separate = [PackedLinear(lin, planned_amx_linear())(x) for lin in (layer.mlp.gate_proj, layer.mlp.up_proj)]
        reference_mlp = layer.mlp(x)
    n = model.config.num_hidden_layers
    assert fuse_decoder_layers(model, ops) == 4 * n + 1
    assert fuse_decoder_layers(model, ops) == 0
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn, FusedAttention) and isinstance(layer.mlp, FusedMLP)
    assert isinstance(model.model.norm, FusedRMSNorm)
    with torch.inference_mode():
        fused = PackedLinear(layer.mlp.gate_up_proj, planned_amx_linear())(x)
        assert torch.equal(fused, torch.cat(separate, -1))
        torch.testing.assert_close(layer.mlp(x), reference_mlp, atol=1e-3, rtol=2**-6)


def test_a_float32_model_is_fused_and_a_float16_one_left_alone(ops, tiny_llama_dir):
    model = load_model(EngineSettings(model=str(tiny_llama_dir), dtype="float32")).model
    assert fuse_decoder_layers(model, None) == 0
    assert fuse_decoder_layers(model, ops) == 4 * model.config.num_hidden_layers + 1
    half = load_model(EngineSettings(model=str(tiny_llama_dir), dtype="float16")).model
    assert fuse_decoder_layers(half, ops) == 0


def test_a_fused_float32_engine_matches_plain_transformers(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, dtype="float32")
    assert isinstance(engine.loaded.model.model.layers[0].self_attn, FusedAttention)
    assert engine.runner.fused_forward
    prompt = random_prompt(random.Random(3), 150)
    logits, _ = first_logits(engine, prompt)
    model = load_model(EngineSettings(model=str(tiny_llama_dir), dtype="float32")).model
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        reference = model(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
    other, _ = first_logits(engine, random_prompt(random.Random(4), 150))  # the comparison can fail
    assert not torch.allclose(other, reference, atol=1e-3, rtol=0)


@needs_onednn_bf16
def test_a_fused_bf16_engine_matches_plain_transformers(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, dtype="bfloat16")
    assert isinstance(engine.loaded.model.model.layers[0].self_attn, FusedAttention)
    rng = random.Random(3)
    prompt = random_prompt(rng, 150)
    logits, _ = first_logits(engine, prompt)
    model = load_model(EngineSettings(model=str(tiny_llama_dir), dtype="bfloat16")).model
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        reference = model(torch.tensor([prompt])).logits[0, -1].float()
    scale = reference.abs().max().item()
    assert (logits - reference).abs().max().item() < 0.05 * scale
    other, _ = first_logits(engine, random_prompt(rng, 150))
    assert (other - reference).abs().max().item() > 0.2 * scale
    assert len(checked(engine.generate(prompt, SamplingParams(max_tokens=4, temperature=0))).token_ids) == 4
