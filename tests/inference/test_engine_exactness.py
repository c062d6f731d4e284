"""A cache hit changes nothing: warm output equals cold output, logits included."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from inference.engine import Engine
from inference.model_loader import load_model
from inference.platform import this_cpu
from inference.settings import EngineSettings
from inference.types import CacheRegion, CacheSpec, SamplingParams
from tests.inference.helpers import checked, random_prompt, runnable_variants

GREEDY_32 = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


def first_logits(engine: Engine, prompt: list[int], cache: CacheSpec | None = None) -> tuple[torch.Tensor, int]:
    seen: dict[str, torch.Tensor] = {}

    def observe(ids: list[str], logits: torch.Tensor) -> None:
        for rid, row in zip(ids, logits, strict=True):
            seen.setdefault(rid, row.clone())

    engine.logits_observer = observe
    rid = f"logits-{random.random()}"
    out = checked(engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0), cache, request_id=rid))
    engine.logits_observer = None
    return seen[rid], out.usage.cached_tokens


def reference_logits(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    """Plain transformers, no kvgate code in the path."""
    model = load_model(EngineSettings(model=str(model_dir), dtype="float32")).model
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0, -1].float()


@pytest.mark.parametrize("model_fixture", ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_mistral_dir"])
def test_first_token_logits_with_a_prefix_hit_match_a_cold_run(make_engine, request, model_fixture):
    model_dir = request.getfixturevalue(model_fixture)
    rng = random.Random(11)
    base = random_prompt(rng, 150)
    longer = base + random_prompt(rng, 70)
    reference = reference_logits(model_dir, longer)

    cold_engine = make_engine(model_dir)
    cold, cold_hit = first_logits(cold_engine, longer)
    warm_engine = make_engine(model_dir)
    first_logits(warm_engine, base)
    warm, warm_hit = first_logits(warm_engine, longer)  # extends a cached prompt mid-way
    rerun, rerun_hit = first_logits(warm_engine, longer)

    assert (cold_hit, warm_hit, rerun_hit) == (0, 144, 208)
    assert torch.allclose(warm, cold, atol=1e-5, rtol=0)
    assert torch.allclose(rerun, cold, atol=1e-5, rtol=0)
    assert torch.allclose(cold, reference, atol=1e-5, rtol=0)
    # The comparison can fail: another prompt's logits are far away.
    other, _ = first_logits(cold_engine, random_prompt(rng, 220))
    assert not torch.allclose(other, cold, atol=1e-3, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model_fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_greedy_continuations_are_identical_cold_and_warm(make_engine, request, model_fixture, dtype):
    engine = make_engine(request.getfixturevalue(model_fixture), dtype=dtype)
    rng = random.Random(12)
    outputs = set()
    for n in (17, 64, 130, 333):
        prompt = random_prompt(rng, n)
        cold = checked(engine.generate(prompt, GREEDY_32))
        warm = checked(engine.generate(prompt, GREEDY_32))
        assert warm.usage.cached_tokens > 0
        assert warm.token_ids == cold.token_ids
        outputs.add(cold.token_ids)
    assert len(outputs) == 4  # different prompts do give different continuations


def two_breakpoints(base_len: int, total: int) -> CacheSpec:
    return CacheSpec(regions=(CacheRegion(base_len, 300), CacheRegion(total, 300)))


def test_extending_a_cached_prompt_gives_the_cold_output(make_engine, tiny_llama_dir):
    # bf16, where a pass computed in other shapes really does round differently.
    rng = random.Random(13)
    warm_engine = make_engine(tiny_llama_dir, dtype="bfloat16")
    # 48 and 64: the shorter prompt's last full block holds its last token, so it is not cached.
    for base_len in (48, 64, 48, 64, 50, 177, 96, 112):
        base = random_prompt(rng, base_len)
        longer = base + random_prompt(rng, rng.randrange(20, 150))
        spec = two_breakpoints(len(base), len(longer))
        cold = checked(make_engine(tiny_llama_dir, dtype="bfloat16").generate(longer, GREEDY_32, spec))
        checked(warm_engine.generate(base, GREEDY_32, CacheSpec(regions=(CacheRegion(len(base), 300),))))
        warm = checked(warm_engine.generate(longer, GREEDY_32, spec))
        assert warm.usage.cached_tokens == (len(base) - 1) // 16 * 16
        assert warm.token_ids == cold.token_ids


def test_extension_under_automatic_caching_and_batching_is_exact_in_bf16(make_engine, tiny_llama_dir):
    """Batch invariance: no split points help here, the kernels alone make it exact."""
    rng = random.Random(16)
    engine = make_engine(tiny_llama_dir, dtype="bfloat16")
    if engine.runner.cpu_kernel is None:
        pytest.skip("needs the batch-invariant CPU attention kernel")
    pairs = []
    for _ in range(8):
        base = random_prompt(rng, rng.randrange(40, 200))
        pairs.append((base, base + random_prompt(rng, rng.randrange(20, 150))))
    cold = [checked(make_engine(tiny_llama_dir, dtype="bfloat16").generate(longer, GREEDY_32)) for _, longer in pairs]
    for base, _ in pairs:
        checked(engine.generate(base, GREEDY_32))
    for i, (_, longer) in enumerate(pairs):  # all at once: batched with each other
        engine.add_request(f"x{i}", longer, GREEDY_32, CacheSpec())
    warm = {}
    while engine.has_unfinished():
        warm.update({o.request_id: checked(o.finished) for o in engine.step() if o.finished})
    for i, c in enumerate(cold):
        assert warm[f"x{i}"].usage.cached_tokens > 0
        assert warm[f"x{i}"].token_ids == c.token_ids


def test_the_torch_fallback_is_exact_for_reruns_only(make_engine, tiny_llama_dir):
    """Without our kernel, split points still make a rerun of the same prompt exact."""
    engine = make_engine(tiny_llama_dir, dtype="bfloat16", attention_backend="torch")
    assert engine.runner.cpu_kernel is None
    rng = random.Random(17)
    for _ in range(4):
        prompt = random_prompt(rng, rng.randrange(40, 300))
        cold = checked(engine.generate(prompt, GREEDY_32))
        assert checked(engine.generate(prompt, GREEDY_32)).token_ids == cold.token_ids


# -- the real model, bf16 --------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return load_model(EngineSettings())


def smollm2_engine(loaded) -> Engine:
    return Engine(EngineSettings(kv_cache_gib=0.25), loaded=loaded)


@pytest.mark.smollm2
def test_smollm2_bf16_warm_equals_cold_over_20_random_prompts(smollm2):
    assert smollm2.dtype == torch.bfloat16 or not torch.cuda.is_available()
    engine = smollm2_engine(smollm2)
    rng = random.Random(14)
    prompts = [random_prompt(rng, rng.randrange(20, 300)) for _ in range(20)]
    colds = [checked(engine.generate(prompt, GREEDY_32)).token_ids for prompt in prompts]
    # Warm: each reads its cached prefix and still gives its own cold output. Where batches are
    # exact (the CPU kernel), all 20 go in one batch: one decode loop rather than 20.
    exact_batches = engine.runner.cpu_kernel is not None
    warm = run_batched(engine, prompts) if exact_batches else [checked(engine.generate(p, GREEDY_32)) for p in prompts]
    assert [o.usage.cached_tokens for o in warm] == [(len(prompt) - 1) // 16 * 16 for prompt in prompts]
    assert [o.token_ids for o in warm] == colds
    # All 20 cold again, batched together on a fresh engine: still each request's own cold output.
    batched = run_batched(smollm2_engine(smollm2), prompts)
    assert all(o.usage.cached_tokens == 0 for o in batched)
    if exact_batches:
        assert [o.token_ids for o in batched] == colds


@pytest.mark.smollm2
def test_every_engine_over_one_loaded_model_rescores_the_top_logits(smollm2):
    # The first engine packs the model's linears, the LM head included; a later one must still find
    # the head's weight for the float32 rescoring, or its greedy picks differ from the first's
    # (found in bf16: a fresh engine's batch disagreed with the first engine's cold runs).
    first, second = smollm2_engine(smollm2), smollm2_engine(smollm2)
    assert first.runner.lm_weight is not None
    assert second.runner.lm_weight is first.runner.lm_weight


def run_batched(engine, prompts):
    """Every prompt added at once, stepped to the end; the finished outputs in prompt order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"batched-{i}", prompt, GREEDY_32, CacheSpec())
    finished = {}
    while engine.has_unfinished():
        finished.update({o.request_id: checked(o.finished) for o in engine.step() if o.finished})
    return [finished[f"batched-{i}"] for i in range(len(prompts))]


@pytest.mark.smollm2
def test_smollm2_bf16_extension_of_a_cached_prompt_equals_cold(smollm2):
    warm_engine = smollm2_engine(smollm2)
    rng = random.Random(15)
    for base_len in (64, 65, 130, 201, 250):
        base = random_prompt(rng, base_len)
        longer = base + random_prompt(rng, rng.randrange(20, 200))
        spec = two_breakpoints(len(base), len(longer))
        cold = checked(smollm2_engine(smollm2).generate(longer, GREEDY_32, spec))
        checked(warm_engine.generate(base, GREEDY_32, CacheSpec(regions=(CacheRegion(len(base), 300),))))
        warm = checked(warm_engine.generate(longer, GREEDY_32, spec))
        assert warm.usage.cached_tokens > 0
        assert warm.token_ids == cold.token_ids


@pytest.mark.smollm2
def test_smollm2_knows_the_capital_of_france(smollm2):
    engine = smollm2_engine(smollm2)
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    out = engine.generate(engine.tokenizer.encode(text), SamplingParams(max_tokens=32, temperature=0))
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("isa", runnable_variants("paged_attention"))
def test_every_kernel_variant_this_cpu_runs_keeps_warm_batched_output_equal_to_cold(
    make_engine, tiny_llama_dir, isa, dtype
):
    """The exactness promise for each ISA variant the plan can pick (KVGATE_KERNEL_ISA caps it), in both dtypes."""
    engine = make_engine(tiny_llama_dir, dtype=dtype, kernel_isa=isa)
    assert engine.plan.variant("paged_attention") in (isa, "avx2")  # float32 pools take avx2 at most
    if engine.plan.prompt_linear == "onednn_packed" and this_cpu().runs("amx"):
        pytest.skip("below amx, an AMX CPU's bf16 linears are oneDNN's, whose sums follow the call's row count")
    rng = random.Random(1700 + len(isa))
    pairs = []
    for _ in range(3):
        base = random_prompt(rng, rng.randrange(40, 120))
        pairs.append((base, base + random_prompt(rng, rng.randrange(20, 90))))
    cold, warm_spec = CacheSpec(salt="cold"), CacheSpec(salt="warm")
    colds = [checked(engine.generate(longer, GREEDY_32, cold)) for _, longer in pairs]
    for base, _ in pairs:
        checked(engine.generate(base, GREEDY_32, warm_spec))
    for i, (_, longer) in enumerate(pairs):  # all at once: batched with each other, each reading its base
        engine.add_request(f"w{i}", longer, GREEDY_32, warm_spec)
    warm = {}
    while engine.has_unfinished():
        warm.update({o.request_id: checked(o.finished) for o in engine.step() if o.finished})
    for i, c in enumerate(colds):
        assert warm[f"w{i}"].usage.cached_tokens > 0 and c.usage.cached_tokens == 0
        assert warm[f"w{i}"].token_ids == c.token_ids
