"""The CPU kernels: paged attention (our C code) and prepacked linears, checked against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.cpu_attention import CpuPagedAttention, RowLayout
from inference.cpu_linear import PackedLinear, can_pack, pack_linears
from inference.settings import EngineSettings
from tests.inference.helpers import planned_amx_linear, runnable_variants

# oneDNN's bf16 path needs AVX-512 (or AVX-NE-CONVERT); on AVX2-only CPUs bf16 linears stay plain.
ONEDNN_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
needs_onednn_bf16 = pytest.mark.skipif(not ONEDNN_BF16, reason="oneDNN has no bf16 path on this CPU")


@pytest.fixture(scope="module", params=runnable_variants("paged_attention"))
def kernel(request) -> CpuPagedAttention:
    """Every ISA variant of the kernel this CPU runs (a build failure is an error: gcc is part of the machine)."""
    return CpuPagedAttention.load(EngineSettings().cache_dir, request.param)


def make_case(dtype, head_dim, heads, kv_heads, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // 16) for n in lengths) + 5
    k = torch.randn(num_blocks, 16, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, 16, kv_heads, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables, start = [], 0
    for n in lengths:
        nb = -(-n // 16)
        tables.append(perm[start : start + nb])
        start += nb
    width = max(len(t) for t in tables)
    table = torch.zeros(len(lengths), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    q = [torch.randn(n, heads, head_dim, generator=gen).to(dtype) for n in lengths]
    return k, v, table, q


def reference(k, v, table_row, q, n):
    """float32 SDPA over a gathered context: the ground truth."""
    kk = k[table_row.long()].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0).float()
    vv = v[table_row.long()].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0).float()
    qq = q.transpose(0, 1).unsqueeze(0).float()
    return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)[0].transpose(0, 1)


def run(kernel, k, v, table, rows, q_rows, scale):
    seqs, poss = zip(*rows, strict=True)
    layout = RowLayout(torch.tensor(seqs, dtype=torch.int32), torch.tensor(poss, dtype=torch.int32), table)
    return kernel(torch.stack(q_rows), k, v, layout, scale)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(("head_dim", "heads", "kv_heads"), [(64, 9, 3), (16, 4, 2), (128, 8, 8)])
def test_matches_float32_sdpa(kernel, dtype, tol, head_dim, heads, kv_heads):
    lengths = [1, 40, 130]
    k, v, table, q = make_case(dtype, head_dim, heads, kv_heads, lengths)
    rows = [(s, p) for s, n in enumerate(lengths) for p in range(n)]
    out = run(kernel, k, v, table, rows, [q[s][p] for s, p in rows], head_dim**-0.5)
    expected = torch.cat([reference(k, v, table[s], q[s], n) for s, n in enumerate(lengths)])
    assert (out.float() - expected).abs().max().item() < tol
    # Not trivially close: a wrong scale is far off.
    wrong = run(kernel, k, v, table, rows, [q[s][p] for s, p in rows], 2 * head_dim**-0.5)
    assert (wrong.float() - expected).abs().max().item() > 10 * tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_chunking_or_neighbours(kernel, dtype):
    n = 300
    k, v, table, q = make_case(dtype, 64, 9, 3, [n, 50], seed=1)
    whole = run(kernel, k, v, table, [(0, p) for p in range(n)], list(q[0]), 0.125)
    pieces = []
    for s, e in [(0, 37), (37, 160), (160, 161), (161, 300)]:
        # Each piece shares its call with rows of another sequence, as under batching.
        rows = [(1, p) for p in range(10, 13)] + [(0, p) for p in range(s, e)]
        qs = [q[1][p] for p in range(10, 13)] + [q[0][p] for p in range(s, e)]
        pieces.append(run(kernel, k, v, table, rows, qs, 0.125)[3:])
    assert torch.equal(torch.cat(pieces), whole)
    one_by_one = torch.cat([run(kernel, k, v, table, [(0, p)], [q[0][p]], 0.125) for p in range(n)])
    assert torch.equal(one_by_one, whole)


def run_decode(kernel, k, v, table, rows, q_rows, num_decode, scale=0.125):
    """Like run, with the leading num_decode rows marked as decode rows."""
    seqs, poss = zip(*rows, strict=True)
    layout = RowLayout(
        torch.tensor(seqs, dtype=torch.int32), torch.tensor(poss, dtype=torch.int32), table, num_decode=num_decode
    )
    return kernel(torch.stack(q_rows), k, v, layout, scale)


# Decode rows take tile_decode_row on avx512_bf16 (bf16 pools) and tile_decode_row_avx2 on AVX2 (float32 pools).
DECODE_DTYPES = pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, 2e-2), (torch.float32, 2e-6)])


@DECODE_DTYPES
@pytest.mark.parametrize(("head_dim", "heads", "kv_heads"), [(64, 9, 3), (128, 8, 8), (64, 32, 2), (16, 4, 2)])
def test_decode_rows_match_float32_sdpa(kernel, head_dim, heads, kv_heads, dtype, tol):
    lengths = [1, 16, 17, 40, 300]
    k, v, table, q = make_case(dtype, head_dim, heads, kv_heads, lengths, seed=3)
    rows = [(s, n - 1) for s, n in enumerate(lengths)]  # each sequence's last position: a decode row
    q_rows = [q[s][n - 1] for s, n in enumerate(lengths)]
    out = run_decode(kernel, k, v, table, rows, q_rows, num_decode=len(rows), scale=head_dim**-0.5)
    expected = torch.stack([reference(k, v, table[s], q[s], n)[-1] for s, n in enumerate(lengths)])
    assert (out.float() - expected).abs().max().item() < tol
    wrong = run_decode(kernel, k, v, table, rows, q_rows, num_decode=len(rows), scale=2 * head_dim**-0.5)
    assert (wrong.float() - expected).abs().max().item() > 0.2


@DECODE_DTYPES
def test_a_decode_row_does_not_depend_on_the_rows_beside_it(kernel, dtype, tol):
    k, v, table, q = make_case(dtype, 64, 9, 3, [300, 50, 120], seed=4)
    alone = [run_decode(kernel, k, v, table, [(0, p)], [q[0][p]], 1) for p in (0, 15, 16, 200, 299)]
    for i, p in enumerate((0, 15, 16, 200, 299)):
        # Beside other decode rows, and before prompt rows of other sequences (a mixed step).
        rows = [(1, 49), (0, p), (2, 119)] + [(1, r) for r in range(20, 45)] + [(2, r) for r in range(3)]
        qs = [q[1][49], q[0][p], q[2][119]] + [q[1][r] for r in range(20, 45)] + [q[2][r] for r in range(3)]
        mixed = run_decode(kernel, k, v, table, rows, qs, num_decode=3)
        assert torch.equal(mixed[1], alone[i][0])
        # The prompt rows are those of a call without decode rows.
        prompt = run_decode(kernel, k, v, table, rows[3:], qs[3:], num_decode=0)
        assert torch.equal(mixed[3:], prompt)


@DECODE_DTYPES
def test_a_decode_row_ignores_the_slots_past_its_position(kernel, dtype, tol):
    """The decode-row loop reads whole blocks: what lies past the row's last key must not matter."""
    k, v, table, q = make_case(dtype, 64, 9, 3, [40], seed=5)
    before = run_decode(kernel, k, v, table, [(0, 36)], [q[0][36]], 1)
    last = int(table[0, 2])
    k[last, 5:], v[last, 5:] = float("nan"), float("inf")  # positions 37..47 of the sequence
    after = run_decode(kernel, k, v, table, [(0, 36)], [q[0][36]], 1)
    assert torch.equal(after, before) and not after.isnan().any()
    v[last, 4] = v[last, 4] * -3  # position 36, the row's own key: a change there shows
    assert not torch.equal(run_decode(kernel, k, v, table, [(0, 36)], [q[0][36]], 1), before)


def test_torch_sdpa_is_not_chunk_invariant_which_is_why_we_have_the_kernel():
    """Some prefix of a causal SDPA, computed alone, differs from the same rows of the whole.

    Which dtype and cut show it depends on the CPU's kernels (bf16 at 700 on AVX-512,
    fp32 on AVX2), so a few are tried; our kernel is chunk invariant on all of them.
    """
    torch.manual_seed(0)
    differs = []
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(1, 9, 1500, 64, dtype=dtype)
        k, v = (torch.randn(1, 3, 1500, 64, dtype=dtype) for _ in range(2))
        whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        for cut in (300, 513, 700):
            first = F.scaled_dot_product_attention(
                q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], is_causal=True, enable_gqa=True
            )
            differs.append(not torch.equal(first, whole[:, :, :cut]))
    assert any(differs)


@needs_onednn_bf16
@pytest.mark.parametrize(("out_features", "in_features", "bias"), [(1536, 576, False), (576, 1536, True)])
def test_packed_linear_rows_do_not_depend_on_the_batch(out_features, in_features, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    packed = PackedLinear(linear, planned_amx_linear())  # as the engine packs it here
    x = torch.randn(1, 300, in_features, dtype=torch.bfloat16)
    full = packed(x)
    if packed.amx is None:  # oneDNN's packed weight: the same sums as its plain matmul
        assert torch.equal(full, F.linear(x, linear.weight, linear.bias))
    else:  # our AMX kernel (amx_linear.py): its own order of sums, as close as oneDNN's to float32
        expected = F.linear(x.float(), linear.weight.float(), None if linear.bias is None else linear.bias.float())
        onednn_error = (F.linear(x, linear.weight, linear.bias).float() - expected).abs().max()
        assert (full.float() - expected).abs().max() <= 2 * onednn_error
    for start, rows in ((0, 1), (1, 1), (7, 1), (5, 3), (20, 16), (40, 257)):
        assert torch.equal(packed(x[:, start : start + rows]), full[:, start : start + rows])


@needs_onednn_bf16
def test_plain_f_linear_is_not_row_invariant_for_one_row():
    """Why PackedLinear pads single rows: oneDNN's one-row path sums in another order."""
    torch.manual_seed(0)
    weight = torch.randn(576, 1536, dtype=torch.bfloat16)
    x = torch.randn(64, 1536, dtype=torch.bfloat16)
    full = F.linear(x, weight)
    assert any(not torch.equal(F.linear(x[s : s + 1], weight), full[s : s + 1]) for s in range(64))


def test_linears_are_packed_exactly_where_onednn_has_a_bf16_path():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))
    assert pack_linears(model) == 0  # float32: never packed
    model = model.to(torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    plain = model(x)
    assert can_pack(model) == ONEDNN_BF16
    assert pack_linears(model) == (2 if ONEDNN_BF16 else 0)
    assert any(isinstance(m, PackedLinear) for m in model.modules()) == ONEDNN_BF16
    torch.testing.assert_close(model(x), plain)


def test_each_build_runs_the_kernels_of_its_variant(kernel: CpuPagedAttention) -> None:
    avx2 = kernel.isa == "avx2"
    assert kernel.uses_avx2(torch.float32, 64, 16, heads_per_kv=3) == avx2
    assert kernel.uses_avx2(torch.bfloat16, 128, 16) == avx2
    assert kernel.uses_avx512bf16(torch.bfloat16, 64, 16) == (kernel.isa in ("avx512bf16", "amx"))
    assert kernel.uses_amx(torch.bfloat16, 64, 16) == (kernel.isa == "amx")
    assert not kernel.uses_avx512bf16(torch.float32, 64, 16)  # float32 pools: the plan gives them the avx2 build
    # A head_dim that is not a multiple of 8 goes to the generic kernel everywhere.
    assert not kernel.uses_avx2(torch.float32, 20, 16)
