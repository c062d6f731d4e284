"""The decode rows' linear kernel (csrc/decode_linear.c) and how ModelRunner routes rows to it by kind."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import torch

from inference.cpu_linear import PackedLinear
from inference.decode_linear import DecodeKernel, DecodeLinear, DecodeRows
from inference.model_runner import Chunk, _plan_rows
from inference.platform import this_cpu
from inference.settings import EngineSettings
from inference.types import CacheSpec, SamplingParams
from tests.inference.helpers import best_kernel_variant, checked, random_prompt

VARIANT = best_kernel_variant("decode_linear")
KERNEL = None if VARIANT is None else DecodeKernel.load(EngineSettings().cache_dir, VARIANT)
AMX = this_cpu().runs("amx")
CPU_FLAGS = Path("/proc/cpuinfo").read_text()
AVX512_BF16 = "avx512_bf16" in CPU_FLAGS
needs_kernel = pytest.mark.skipif(KERNEL is None or not KERNEL.bf16, reason="the bf16 decode kernel needs avx512_bf16")


def test_the_bf16_kernel_is_there_exactly_where_the_cpu_has_avx512_bf16():
    assert (KERNEL is not None and KERNEL.bf16) == AVX512_BF16
    # The exact-blocks kernel (test_exact_blocks.py) needs AVX2 and FMA only.
    assert (KERNEL is not None and KERNEL.blocks) == (" avx2" in CPU_FLAGS and " fma" in CPU_FLAGS)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ weight.double().T
    return out if bias is None else out + bias.double()


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "bias"),
    [(960, 576, False), (576, 1536, True), (100, 33, True), (7, 2, False), (64, 1, True)],
)
def test_matches_float64_matmul(out_features, in_features, bias):
    torch.manual_seed(0)
    weight = torch.randn(out_features, in_features).to(torch.bfloat16)
    b = torch.randn(out_features).to(torch.bfloat16) if bias else None
    x = torch.randn(5, in_features).to(torch.bfloat16)
    packed = KERNEL.pack(weight)
    exact = reference(x, weight, b)
    f32 = KERNEL.linear(x, packed, out_features, b, out_dtype=torch.float32)
    assert f32.dtype == torch.float32 and f32.shape == (5, out_features)
    torch.testing.assert_close(f32.double(), exact, atol=1e-4 * in_features**0.5, rtol=1e-5)
    bf16 = KERNEL.linear(x, packed, out_features, b)
    assert bf16.dtype == torch.bfloat16
    assert torch.equal(bf16, f32.to(torch.bfloat16))  # bf16 output: the float32 sums, rounded to nearest even
    # The check can fail: another weight gives other outputs.
    other = KERNEL.linear(x, KERNEL.pack(torch.randn(out_features, in_features).to(torch.bfloat16)), out_features, b)
    assert not torch.equal(other, bf16)


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(3072, 576), (576, 1536), (49152, 576)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_row_alone_equals_the_row_in_any_batch(out_features, in_features, threads):
    torch.manual_seed(1)
    weight = torch.randn(out_features, in_features).to(torch.bfloat16)
    packed = KERNEL.pack(weight)
    x = torch.randn(24, in_features).to(torch.bfloat16) * 4
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = [KERNEL.linear(x[i : i + 1], packed, out_features) for i in range(24)]
        for rows in range(2, 17):
            start = rows % 5
            batch = KERNEL.linear(x[start : start + rows], packed, out_features, out_dtype=torch.float32)
            for i in range(rows):
                assert torch.equal(batch[i].to(torch.bfloat16), alone[start + i][0]), (rows, i)
        # Rows with a stride (a view of a wider tensor) give the same bits too.
        wide = torch.cat([x, x], dim=1)[:, :in_features]
        assert torch.equal(KERNEL.linear(wide[3:11], packed, out_features), torch.cat(alone[3:11]))
    finally:
        torch.set_num_threads(old)


@needs_kernel
def test_decode_linear_sends_leading_decode_rows_to_the_kernel_and_the_rest_to_onednn():
    torch.manual_seed(2)
    linear = torch.nn.Linear(576, 960, bias=True).to(torch.bfloat16)
    rows = DecodeRows()
    module = DecodeLinear(PackedLinear(linear), linear.weight, KERNEL, rows)
    x = torch.randn(1, 9, 576).to(torch.bfloat16)
    onednn = PackedLinear(linear)(x)
    kernel = KERNEL.linear(x[0], module.decode_weight, 960, linear.bias.detach())
    torch.testing.assert_close(kernel, onednn[0])  # the same linear, in another sum order
    # The kernel's copy of the weight swapped for another one, so either path's rows are recognisable.
    other = torch.randn(960, 576).to(torch.bfloat16)
    module.decode_weight = KERNEL.pack(other)
    kernel = KERNEL.linear(x[0], module.decode_weight, 960, linear.bias.detach())
    for count in range(10):
        rows.count = count
        out = module(x)
        assert out.shape == (1, 9, 960)
        assert torch.equal(out[0, :count], kernel[:count])
        assert torch.equal(out[0, count:], onednn[0, count:])
        assert count == 0 or not torch.equal(out[0, :count], onednn[0, :count])


def chunk(start: int, n: int, prompt: int | None, sample: bool = True) -> Chunk:
    return Chunk(
        token_ids=list(range(100 + start, 100 + start + n)),
        start=start,
        slots=list(range(1000 + start, 1000 + start + n)),
        block_ids=[0],
        sample=sample,
        num_prompt_tokens=prompt,
    )


def test_rows_split_by_kind_decode_rows_first():
    chunks = [
        chunk(0, 4, prompt=10, sample=False),  # prefill, mid-prompt
        chunk(20, 1, prompt=20),  # decode: its input is the first generated token
        chunk(7, 5, prompt=9),  # recompute after a preemption: prompt rows 7-8, decode rows 9-11
        chunk(19, 1, prompt=20),  # the prompt's last row: a prompt row (it samples the first token)
        chunk(3, 2, prompt=None),  # no prompt length given: all prompt rows
    ]
    plan = _plan_rows(chunks, split_decode=True)
    assert plan.num_decode == 4
    assert plan.positions == [20, 9, 10, 11, 0, 1, 2, 3, 7, 8, 19, 3, 4]
    assert plan.row_seq == [1, 2, 2, 2, 0, 0, 0, 0, 2, 2, 3, 4, 4]
    assert plan.ids == [100 + p for p in plan.positions] and plan.slots == [1000 + p for p in plan.positions]
    assert [plan.positions[r] for r in plan.sample_rows] == [20, 11, 19, 4]
    plain = _plan_rows(chunks, split_decode=False)
    assert plain.num_decode == 0
    assert plain.positions == [0, 1, 2, 3, 20, 7, 8, 9, 10, 11, 19, 3, 4]
    assert [plain.positions[r] for r in plain.sample_rows] == [20, 11, 19, 4]


@needs_kernel
def test_engine_routes_decode_rows_to_the_kernel_unless_told_not_to(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, dtype="bfloat16")
    # Where the CPU has AMX, every row runs in the AMX linear kernel instead (amx_linear.py).
    assert (engine.runner.decode_rows is not None) == (not AMX)
    onednn = make_engine(tiny_llama_dir, dtype="bfloat16", decode_linear="onednn")
    assert onednn.runner.decode_rows is None
    assert make_engine(tiny_llama_dir).runner.decode_rows is None  # float32: oneDNN's packing does not apply
    prompt = random_prompt(random.Random(41), 60)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    out = checked(engine.generate(prompt, params)).token_ids
    assert len(out) == 16
    # Generated tokens are re-read as prompt rows (oneDNN) when a conversation continues: the
    # continuation is computed, and cached, like any other prompt.
    again = checked(engine.generate(prompt + list(out), params))
    assert again.usage.cached_tokens > 0


def test_decode_rows_are_counted_per_thread():
    """Engines over one loaded model may step at once, each in its own thread."""
    rows = DecodeRows()
    rows.count = 5
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(rows.count))
    thread.start()
    thread.join()
    assert (rows.count, seen) == (5, [0])


@needs_kernel
def test_mixed_steps_and_recompute_after_preemption_give_the_solo_outputs(make_engine, tiny_llama_dir):
    """bf16 with the decode kernel (or, where the CPU has AMX, the AMX kernel for every row): prompt
    and decode rows share passes, and preempted requests recompute their generated tokens as decode
    rows again; every output is still its solo run's."""
    rng = random.Random(22)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    requests = [(f"r{i}", random_prompt(rng, rng.randrange(30, 90))) for i in range(8)]
    roomy = make_engine(tiny_llama_dir, dtype="bfloat16")
    solo = {rid: checked(roomy.generate(prompt, params)).token_ids for rid, prompt in requests}

    tight = make_engine(tiny_llama_dir, dtype="bfloat16", kv_cache_blocks=24, max_num_batched_tokens=64)
    assert (tight.runner.decode_rows is not None) == (not AMX)
    seen = {"mixed": 0, "spanning": 0}
    execute = tight.runner.execute

    def spy(chunks):
        kinds = {c.start >= c.num_prompt_tokens for c in chunks}
        seen["mixed"] += len(kinds) == 2
        seen["spanning"] += any(c.start < c.num_prompt_tokens < c.end for c in chunks)
        return execute(chunks)

    tight.runner.execute = spy
    for rid, prompt in requests:
        tight.add_request(rid, prompt, params, CacheSpec())
    outs = {}
    while tight.has_unfinished():
        outs.update({o.request_id: checked(o.finished).token_ids for o in tight.step() if o.finished})
    assert tight.scheduler.num_preemptions > 0
    assert seen["mixed"] > 0 and seen["spanning"] > 0  # both cases really ran
    assert outs == solo
