"""Where a decode step's time goes, at 1 and 8 streams, beside the memory-bandwidth floor.

Run: .venv/bin/python bench/decode_profile.py [--write-docs] [--steps 30]

SmolLM2-135M-Instruct as the engine loads it (bf16 on CPUs with avx512_bf16). Each
stream has a 256-token prompt, greedy, ignore_eos; after prefill and a few warm-up
steps, `--steps` decode steps are timed with light wrappers around the engine's parts
(each adds about a microsecond per call):

- linears: every linear of the decoder layers: DecodeLinear (the decode kernel for decode
  rows) where the engine uses it, else PackedLinear (oneDNN, packed weights);
- attention: the paged attention function of each layer (KV write + C kernel), or the C
  kernel alone where the runner runs fused_forward;
- LM head + rescoring: the LM head (the decode kernel's float32 logits for decode rows,
  else oneDNN's and the float32 rescoring of the top logits);
- other model ops: the rest of the forward pass (norms, rotary, SiLU, residuals,
  embedding, HF module plumbing);
- input building: the model runner's own work before the forward pass;
- engine: scheduling, sampling, KV bookkeeping, detokenizing (the step minus the pass).

The floor is the bytes of weights one step must read (every linear's weight and the
LM head) over the memory bandwidth measured here with a large copy.
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.cpu_threads import set_openmp_defaults

set_openmp_defaults()

import torch  # noqa: E402

from bench.report import machine_description, write_section  # noqa: E402
from inference import fused_ops as fused_ops_module  # noqa: E402
from inference import model_runner as runner_module  # noqa: E402
from inference import paged_attention as attention_module  # noqa: E402
from inference.cpu_attention import CpuPagedAttention  # noqa: E402
from inference.cpu_linear import PackedLinear  # noqa: E402
from inference.decode_linear import BlockDecodeLinear, DecodeLinear  # noqa: E402
from inference.engine import Engine  # noqa: E402
from inference.model_loader import load_model  # noqa: E402
from inference.settings import EngineSettings  # noqa: E402
from inference.types import CacheSpec, SamplingParams  # noqa: E402

TIMES: dict[str, float] = defaultdict(float)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[name] += time.perf_counter() - start

    return wrapper


def instrument(engine: Engine) -> None:
    PackedLinear.forward = timed("linears", PackedLinear.forward)
    fused_silu = timed("linears", PackedLinear.forward_silu_mul)  # the AMX gate|up with SiLU*up in its output
    plain_silu = PackedLinear.forward_silu_mul  # calls forward (timed already) and the separate silu_mul
    PackedLinear.forward_silu_mul = lambda self, x, ops: (fused_silu if self.silu_pairs else plain_silu)(self, x, ops)
    DecodeLinear.forward = timed("decode_linears", DecodeLinear.forward)
    BlockDecodeLinear.forward = timed("decode_linears", BlockDecodeLinear.forward)
    torch.nn.Linear.forward = timed("linears", torch.nn.Linear.forward)  # float32 models keep plain linears
    # The attention function is looked up by name in transformers' registry at every call.
    from transformers import AttentionInterface

    attention = timed("attention", attention_module.paged_attention)
    AttentionInterface.register(attention_module.ATTN_IMPLEMENTATION, attention)
    # Fused decoder layers (bf16 on CPU) call it directly, not through the registry: one or the other runs.
    fused_ops_module.paged_attention = attention
    engine.runner._logits = timed("lm_head", engine.runner._logits)
    engine.runner._decode_logits = timed("lm_head", engine.runner._decode_logits)
    engine.runner.model.model.forward = timed("forward", engine.runner.model.model.forward)
    if engine.runner.fused_forward:  # the stack without transformers' plumbing: the C kernel is the attention
        runner_module.fused_forward = timed("forward", runner_module.fused_forward)
        CpuPagedAttention.__call__ = timed("attention", CpuPagedAttention.__call__)
    engine.runner.execute = timed("execute", engine.runner.execute)
    head = engine.runner.model.lm_head
    head.forward = timed("head_linear", head.forward)  # also inside "linears": subtracted there


def bandwidth_gb_s() -> float:
    src = torch.empty(256 * 2**20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best / 1e9  # read + write


def weight_bytes(model: torch.nn.Module) -> int:
    dtype = next(model.parameters()).dtype
    total = 0
    for module in model.modules():
        if isinstance(module, PackedLinear | torch.nn.Linear):
            total += module.in_features * module.out_features * dtype.itemsize
    return total


def profile(engine: Engine, streams: int, steps: int) -> dict:
    rng = random.Random(streams)
    params = SamplingParams(max_tokens=steps + 10, temperature=0, ignore_eos=True)
    for i in range(streams):
        engine.add_request(f"p{streams}-{i}", [rng.randrange(100, 40000) for _ in range(256)], params, CacheSpec())
    while engine.num_waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    for _ in range(5):
        engine.step()
    TIMES.clear()
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - start)
    t = {k: 1e3 * v / steps for k, v in TIMES.items()}  # before the profiled step and the drain below
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        engine.step()
    ops = sum(e.count for e in prof.key_averages())
    while engine.has_unfinished():
        engine.step()
    step = 1e3 * sum(walls) / steps
    # The LM head is a PackedLinear too; a DecodeLinear calls its PackedLinear for prompt rows only.
    layer_linears = t["decode_linears"] if "decode_linears" in t else t["linears"] - t.get("head_linear", 0.0)
    parts = {
        "linears": layer_linears,
        "attention": t["attention"],
        "LM head + rescoring": t["lm_head"],
        "other model ops": t["forward"] - layer_linears - t["attention"],
        "input building": t["execute"] - t["forward"] - t["lm_head"],
        "engine (schedule, sample, bookkeeping)": step - t["execute"],
    }
    return {
        "streams": streams,
        "step_ms": step,
        "median_ms": 1e3 * statistics.median(walls),
        "parts": parts,
        "ops": ops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--label", default="", help="a note on the machine's load, shown in the section")
    args = parser.parse_args()
    loaded = load_model(EngineSettings())
    engine = Engine(EngineSettings(kv_cache_gib=0.5), loaded=loaded)
    instrument(engine)
    load = [os.getloadavg()[0]]
    rows = [profile(engine, s, args.steps) for s in (1, 8)]
    load.append(os.getloadavg()[0])
    bw = bandwidth_gb_s()
    wbytes = weight_bytes(loaded.model)
    floor_ms = wbytes / (bw * 1e9) * 1e3
    lines = [
        f"Machine: {machine_description()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"model {loaded.model_id} in {str(loaded.dtype).removeprefix('torch.')}. "
        f"Load average during the run: {min(load):.1f} to {max(load):.1f}. {args.label}",
        "",
        f"Weights read per decode step: {wbytes / 1e6:.0f} MB; memory bandwidth (256 MB copy, best of 5): "
        f"{bw:.1f} GB/s; floor: {floor_ms:.1f} ms per step ({1e3 / floor_ms:.0f} steps/s).",
        "",
        "| streams | step (mean) | step (median) | tensor ops per step | "
        + " | ".join(rows[0]["parts"])
        + " | floor / step |",
        "|---" * (5 + len(rows[0]["parts"])) + "|",
    ]
    for r in rows:
        cells = " | ".join(f"{v:.1f} ms ({100 * v / r['step_ms']:.0f}%)" for v in r["parts"].values())
        lines.append(
            f"| {r['streams']} | {r['step_ms']:.1f} ms | {r['median_ms']:.1f} ms | {r['ops']} | {cells} "
            f"| {floor_ms / r['step_ms']:.2f} |"
        )
    print("\n".join(lines))
    if args.write_docs:
        write_section("decode-profile", "Decode step profile (bench/decode_profile.py)", lines)


if __name__ == "__main__":
    main()
