"""Every C kernel builds for every ISA variant it has, on any machine; the variants this CPU runs agree.

The compile matrix is syntax-only (about a second a file and variant), so it runs everywhere:
CI runs on one CPU at a time, and a kernel that only builds on that CPU lost its kernel on all
the others once (issue 24: paged_attention.c built for x86-64-v3 alone).
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from inference import native
from inference.decode_linear import DecodeKernel
from inference.exact_blocks import Q4_1, Q8_0, find_blocks
from inference.fused_ops import FusedOps
from inference.kernels import load_kernels
from inference.platform import KERNEL_VARIANTS, KernelSettings, have_compiler, plan_kernels, this_cpu
from inference.settings import EngineSettings
from tests.inference.helpers import runnable_variants
from tests.model_fixtures import quantize_q4_1, quantize_q8_0

MATRIX = [(name, isa) for name, variants in KERNEL_VARIANTS.items() for isa in variants]


def test_every_kernel_source_is_in_the_matrix():
    assert {p.stem for p in native.CSRC.glob("*.c")} == set(KERNEL_VARIANTS)


@pytest.mark.parametrize(("name", "isa"), MATRIX, ids=[f"{n}-{i}" for n, i in MATRIX])
def test_the_kernel_compiles_for_the_variant(name, isa):
    done = subprocess.run(native.compile_command(name, isa, "", syntax_only=True), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_matrix_catches_a_kernel_that_builds_for_one_variant_only(tmp_path, monkeypatch):
    """Main's paged_attention.c of issue 24 in miniature: a name declared under one #if, used outside it."""
    (tmp_path / "paged_attention.c").write_text(
        "#if defined(__AVX2__) && !defined(__AVX512BF16__)\nenum { AVX2_TILE_VECS = 48 };\n#endif\n"
        "int f(void) { return AVX2_TILE_VECS; }\n"
    )
    monkeypatch.setattr(native, "CSRC", tmp_path)
    results = {}
    for isa in KERNEL_VARIANTS["paged_attention"]:
        cmd = native.compile_command("paged_attention", isa, "", syntax_only=True)
        results[isa] = subprocess.run(cmd, capture_output=True).returncode == 0
    assert results == {"generic": False, "avx2": True, "avx512bf16": False, "amx": False}


def test_every_kernel_the_plan_names_here_builds_and_loads():
    """On this CPU, for both dtypes the engine computes in: a kernel that should build and does not fails here."""
    assert have_compiler(), "gcc is part of every machine kvgate is tested on"
    for dtype in ("bfloat16", "float32"):
        plan = plan_kernels(this_cpu(), device="cpu", dtype=dtype, settings=KernelSettings(), fused_ops_version=2)
        kernels = load_kernels(plan, EngineSettings().cache_dir)
        assert (kernels.attention is not None) == (plan.variant("paged_attention") is not None)
        assert (kernels.fused is not None) == bool(plan.fused_ops)
        assert (kernels.decode is not None) == (plan.decode_linear != "prompt")
        assert (kernels.amx is not None) == (plan.prompt_linear == "amx")


def test_a_kernel_that_does_not_build_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    (tmp_path / "fused_ops.c").write_text("this is not C\n")
    monkeypatch.setattr(native, "CSRC", tmp_path)
    native.load_library.cache_clear()
    try:
        with pytest.raises(native.KernelBuildError, match="did not build"):
            native.load_library("fused_ops", str(tmp_path / "cache"), "generic")
    finally:
        native.load_library.cache_clear()


def _rows(seed: int, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("isa", runnable_variants("fused_ops"))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_fused_ops_variant_gives_the_portable_ones_bits(isa, dtype):
    cache = EngineSettings().cache_dir
    portable, ops = FusedOps.load(cache, "generic"), FusedOps.load(cache, isa)
    x, delta, weight = _rows(0, 37, 576, dtype=dtype), _rows(1, 37, 576, dtype=dtype), _rows(2, 576, dtype=dtype)
    gate_up = _rows(3, 37, 2 * 1536, dtype=dtype) * 4
    assert torch.equal(ops.rmsnorm(x, weight, 1e-5), portable.rmsnorm(x, weight, 1e-5))
    assert all(map(torch.equal, ops.add_rmsnorm(x, delta, weight, 1e-5), portable.add_rmsnorm(x, delta, weight, 1e-5)))
    assert torch.equal(ops.silu_mul(gate_up), portable.silu_mul(gate_up))
    # Row invariance: a row alone gives the bits it gets among the others.
    assert torch.equal(ops.silu_mul(gate_up[5:6]), ops.silu_mul(gate_up)[5:6])
    assert torch.equal(ops.rmsnorm(x[7:9], weight, 1e-5), ops.rmsnorm(x, weight, 1e-5)[7:9])
    # The check can fail: other data gives other bits.
    assert not torch.equal(ops.silu_mul(gate_up * 2), portable.silu_mul(gate_up))


@pytest.mark.parametrize("isa", runnable_variants("decode_linear"))
@pytest.mark.parametrize("fmt", [Q4_1, Q8_0])
def test_every_blocks_variant_gives_the_same_bits(isa, fmt):
    cache = EngineSettings().cache_dir
    first, kernel = DecodeKernel.load(cache, runnable_variants("decode_linear")[0]), DecodeKernel.load(cache, isa)
    raw = torch.randn(96, 576, generator=torch.Generator().manual_seed(4)) * 0.05
    blocks = find_blocks(quantize_q4_1(raw) if fmt == Q4_1 else quantize_q8_0(raw))
    assert blocks is not None
    x = _rows(5, 9, 576, dtype=torch.float32)
    out = kernel.blocks_linear(x, blocks)
    assert torch.equal(out, first.blocks_linear(x, blocks))
    assert torch.equal(kernel.blocks_linear(x[3:4], blocks), out[3:4])
    assert not torch.equal(kernel.blocks_linear(x * 2, blocks), out)
