"""The AMX linear kernel (csrc/amx_linear.c): close to float32, and each row's result its own.

Runs where the CPU has AMX (Sapphire Rapids and later); elsewhere PackedLinear uses oneDNN."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.amx_linear import AmxLinearKernel
from inference.platform import this_cpu
from inference.settings import EngineSettings

KERNEL = AmxLinearKernel.load(EngineSettings().cache_dir) if this_cpu().runs("amx") else None
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no AMX on this CPU")


def float_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float())


@pytest.mark.parametrize(("n", "k", "bias"), [(1536, 576, False), (576, 1536, True), (960, 576, True), (100, 70, True)])
def test_matches_float32_within_bf16_rounding(n, k, bias):
    torch.manual_seed(0)
    weight = torch.randn(n, k, dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, dtype=torch.bfloat16) if bias else None
    x = torch.randn(77, k, dtype=torch.bfloat16)
    packed = KERNEL.pack(weight)
    out = KERNEL.linear(x, packed, n, b)
    expected = float_linear(x, weight, b)
    # One bf16 rounding of the output: relative 2^-8 at most.
    assert ((out.float() - expected).abs() <= expected.abs() * 2**-8 + 1e-6).all()
    # Not trivially close: without the bias, or with one weight row changed, it is far off.
    if bias:
        assert (KERNEL.linear(x, packed, n, None).float() - expected).abs().max() > 0.1
    weight[3] = -weight[3]
    assert (KERNEL.linear(x, KERNEL.pack(weight), n, b).float() - expected)[:, 3].abs().max() > 0.1


@pytest.mark.parametrize(("n", "k"), [(1536, 576), (576, 1536), (49152, 576)])
def test_a_row_does_not_depend_on_the_rows_beside_it(n, k):
    torch.manual_seed(1)
    weight = torch.randn(n, k, dtype=torch.bfloat16)
    x = torch.randn(600, k, dtype=torch.bfloat16)
    packed = KERNEL.pack(weight)
    full = KERNEL.linear(x, packed, n, None)
    for start, rows in ((0, 1), (3, 2), (7, 13), (20, 16), (40, 33), (100, 257), (5, 595)):
        assert torch.equal(KERNEL.linear(x[start : start + rows], packed, n, None), full[start : start + rows])
    # Strided rows (a view into a wider tensor) give the same too.
    wide = torch.cat([x, x], dim=1)[:, :k]
    assert torch.equal(KERNEL.linear(wide, packed, n, None), full)


def test_onednn_amx_matmul_rows_do_depend_on_the_call_which_is_why_this_kernel_exists():
    torch.manual_seed(0)
    weight = torch.randn(576, 1536, dtype=torch.bfloat16)
    x = torch.randn(600, 1536, dtype=torch.bfloat16)
    onednn = torch.ops.mkldnn._reorder_linear_weight(weight)

    def run(rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(rows, onednn, None, "none", [], "")

    full = run(x)
    assert any(not torch.equal(run(x[:m]), full[:m]) for m in (33, 40, 48, 64, 100))
    packed = KERNEL.pack(weight)
    ours = KERNEL.linear(x, packed, 576, None)
    assert all(torch.equal(KERNEL.linear(x[:m], packed, 576, None), ours[:m]) for m in (33, 40, 48, 64, 100))


def test_no_rows():
    weight = torch.randn(64, 64, dtype=torch.bfloat16)
    assert KERNEL.linear(torch.empty(0, 64, dtype=torch.bfloat16), KERNEL.pack(weight), 64, None).shape == (0, 64)


@pytest.mark.parametrize("bias", [False, True])
def test_silu_mul_in_the_output_stage_is_the_two_step_result_bit_for_bit(bias):
    from inference.amx_linear import PAIRS, PLAIN, SILU_MUL
    from inference.fused_ops import FusedOps

    ops = FusedOps.load(EngineSettings().cache_dir, "avx512bf16")
    torch.manual_seed(2)
    n, k = 3072, 576  # a fused [gate; up] of 1536 each
    weight = torch.randn(n, k, dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, dtype=torch.bfloat16) if bias else None
    x = torch.randn(45, k, dtype=torch.bfloat16)
    plain = KERNEL.linear(x, KERNEL.pack(weight), n, b, PLAIN)
    pairs = KERNEL.pack(weight, pairs=True)
    assert torch.equal(KERNEL.linear(x, pairs, n, b, PAIRS), plain)  # pairs-packed, written apart: the same
    fused = KERNEL.linear(x, pairs, n, b, SILU_MUL)
    assert fused.shape == (45, n // 2)
    assert torch.equal(fused, ops.silu_mul(plain))
    assert not torch.equal(fused, ops.silu_mul(torch.cat([plain[:, n // 2 :], plain[:, : n // 2]], 1)))
    # Row by row the same as well.
    assert torch.equal(KERNEL.linear(x[7:9], pairs, n, b, SILU_MUL), fused[7:9])


def test_the_thread_count_changes_nothing():
    torch.manual_seed(3)
    weight = torch.randn(960, 576, dtype=torch.bfloat16)
    packed = KERNEL.pack(weight)
    threads = torch.get_num_threads()
    try:
        for rows in (1, 8, 200):  # small calls split the outputs finer than large ones
            x = torch.randn(rows, 576, dtype=torch.bfloat16)
            torch.set_num_threads(1)
            alone = KERNEL.linear(x, packed, 960, None)
            torch.set_num_threads(max(2, threads))
            assert torch.equal(KERNEL.linear(x, packed, 960, None), alone)
    finally:
        torch.set_num_threads(threads)
