"""Where a cold prefill's time goes, op by op, beside this CPU's matmul limit (in the engine's dtype).

Run: .venv/bin/python bench/prefill_profile.py [--quick]
For SmolLM2-135M-Instruct (bf16 on CPUs with avx512_bf16/AMX, else float32), with the engine's thread count:
  1. the matmul GFLOP/s this CPU reaches in that dtype (as the engine runs its linears)
     at the model's shapes and at a large square shape: the practical limit;
  2. the FLOPs of a cold prefill (linears + causal attention) and the rate each run reaches;
  3. a torch.profiler breakdown of one cold prefill per length: attention (our C kernel),
     matmuls, the fused element-wise ops, other torch ops, and Python overhead (the rest).
Prints the tables and rewrites the prefill-profile section of docs/benchmarks.md. Not a test.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.cpu_threads import set_openmp_defaults

set_openmp_defaults()  # before torch is imported, as `kvgate` does

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from bench.report import machine_description, write_section  # noqa: E402
from inference import amx_linear, cpu_attention, fused_ops  # noqa: E402
from inference.engine import Engine  # noqa: E402
from inference.model_loader import load_model, select_dtype  # noqa: E402
from inference.platform import KernelSettings, have_compiler, plan_kernels, this_cpu  # noqa: E402
from inference.settings import EngineSettings  # noqa: E402
from inference.types import SamplingParams  # noqa: E402

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0)
MATMUL_OPS = {
    "mkldnn::_linear_pointwise", "aten::linear", "aten::mm", "aten::addmm", "aten::matmul", "aten::bmm",
    "kvgate.amx_linear",  # our AMX kernel (where the CPU has AMX), SiLU*up of gate|up included
}  # fmt: skip
ATTENTION = "kvgate.attention"
FUSED = ("kvgate.rmsnorm", "kvgate.rotary", "kvgate.silu_mul", "kvgate.add_rmsnorm", "kvgate.rotary_to_pool")


def best_seconds(fn: Callable[[], object], reps: int, inner: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def engine_dtype() -> torch.dtype:
    """The dtype the engine computes in on this CPU (its `auto`): bf16 with avx512_bf16/AMX, else float32."""
    return select_dtype("auto", torch.device("cpu"))


def dtype_name() -> str:
    return str(engine_dtype()).removeprefix("torch.")


def matmul_path() -> str:
    return "oneDNN-packed weights" if engine_dtype() == torch.bfloat16 else "torch's linear"


def matmul_limit(shapes: list[tuple[int, int]], rows: int, reps: int) -> list[dict]:
    """GFLOP/s of x[rows, K] @ W[N, K]^T as the engine runs its linears, best of reps: bf16 with W
    prepacked for oneDNN where the engine computes in bf16, else float32 through torch's linear."""
    out = []
    bf16 = engine_dtype() == torch.bfloat16
    for n, k in shapes:
        x = torch.randn(rows, k).to(engine_dtype())
        weight = torch.randn(n, k).to(engine_dtype())
        packed = torch.ops.mkldnn._reorder_linear_weight(weight) if bf16 else weight

        def mm(x: torch.Tensor = x, packed: torch.Tensor = packed) -> torch.Tensor:
            if bf16:
                return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            return torch.nn.functional.linear(x, packed)

        seconds = best_seconds(mm, reps)
        out.append({"shape": f"{rows} x {k} @ {k} x {n}", "gflops": 2 * rows * n * k / seconds / 1e9})
    return out


def attention_rate(config: object, n: int, chunk: int, reps: int) -> float:
    """GFLOP/s of our attention kernel alone: one layer's causal n-token prefill in chunks, random data in the
    engine's dtype."""
    c = config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    settings = EngineSettings()
    plan = plan_kernels(
        this_cpu(), device="cpu", dtype=dtype_name(), settings=KernelSettings.of(settings), compiler=have_compiler()
    )
    if plan.variant("paged_attention") is None:
        return float("nan")
    kernel = cpu_attention.CpuPagedAttention.load(settings.cache_dir, plan.variant("paged_attention"))
    gen = torch.Generator().manual_seed(0)
    blocks = n // 16 + 1
    dtype = engine_dtype()
    k, v = (torch.randn(blocks, 16, c.num_key_value_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(n, c.num_attention_heads, head_dim, generator=gen).to(dtype)
    table = torch.randperm(blocks, generator=gen).to(torch.int32)[None]
    layouts = [
        cpu_attention.RowLayout(
            torch.zeros(min(n, s + chunk) - s, dtype=torch.int32),
            torch.arange(s, min(n, s + chunk), dtype=torch.int32),
            table,
        )
        for s in range(0, n, chunk)
    ]

    def run() -> None:
        for layout in layouts:
            rows = layout.row_pos.long()
            kernel(q[rows], k, v, layout, head_dim**-0.5)

    flops = 4 * c.num_attention_heads * head_dim * (n * (n + 1) // 2)
    return flops / best_seconds(run, reps, inner=1) / 1e9


def linear_shapes(config: object) -> list[tuple[int, int]]:
    """(out, in) of each matmul in a decoder layer, as the engine runs them (q|k|v and gate|up fused)."""
    c = config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * head_dim
    return [
        (qkv, c.hidden_size),
        (c.num_attention_heads * head_dim, c.hidden_size),
        (2 * c.intermediate_size, c.hidden_size),
        (c.hidden_size, c.intermediate_size),
    ]


def prefill_flops(config: object, n: int) -> tuple[float, float]:
    """(linear, attention) FLOPs of a cold n-token prefill; the LM head runs on the last row only."""
    c = config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_layer = sum(out * inp for out, inp in linear_shapes(config))
    linear = 2 * n * per_layer * c.num_hidden_layers + 2 * c.vocab_size * c.hidden_size
    # q.k and p.v, 2 FLOPs per multiply-add each, over the causal triangle of every head.
    attention = 4 * c.num_attention_heads * head_dim * (n * (n + 1) // 2) * c.num_hidden_layers
    return float(linear), float(attention)


def label_native_calls() -> None:
    """Make the ctypes calls visible to the profiler as named regions."""

    def labelled(name: str, fn: Callable) -> Callable:
        def call(*args: object, **kwargs: object) -> object:
            with record_function(name):
                return fn(*args, **kwargs)

        return call

    cls = cpu_attention.CpuPagedAttention
    cls.__call__ = labelled(ATTENTION, cls.__call__)
    for name in ("rmsnorm", "rotary", "silu_mul", "add_rmsnorm", "rotary_to_pool"):
        setattr(fused_ops.FusedOps, name, labelled(f"kvgate.{name}", getattr(fused_ops.FusedOps, name)))
    amx_linear.AmxLinearKernel.linear = labelled("kvgate.amx_linear", amx_linear.AmxLinearKernel.linear)


def profile_prefill(engine: Engine, prompt: list[int]) -> dict:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        engine.generate(prompt, ONE_TOKEN)
        wall = time.perf_counter() - start
    parts = {"attention": 0.0, "matmuls": 0.0, "fused norm/rotary/SiLU": 0.0, "other torch ops": 0.0}
    for ev in prof.key_averages():
        seconds = ev.self_cpu_time_total / 1e6
        if ev.key == ATTENTION:
            parts["attention"] += seconds
        elif ev.key in MATMUL_OPS:
            parts["matmuls"] += seconds
        elif ev.key in FUSED:
            parts["fused norm/rotary/SiLU"] += seconds
        elif not ev.key.startswith("ProfilerStep"):
            parts["other torch ops"] += seconds
    parts["Python and the rest"] = max(0.0, wall - sum(parts.values()))
    return {"wall": wall, "parts": parts}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="1k and 2k tokens, fewer repetitions")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    lengths = [1024, 2048] if args.quick else [1024, 4096]
    reps = 2 if args.quick else 3

    settings = EngineSettings()
    loaded = load_model(settings)
    config = loaded.model.config
    threads = torch.get_num_threads()
    label_native_calls()
    engine = Engine(EngineSettings(kv_cache_gib=1.0), loaded=loaded)
    rng = random.Random(7)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, 40000) for _ in range(n)]

    engine.generate(prompt(64), ONE_TOKEN)

    shapes = [*linear_shapes(config), (2048, 2048)]

    def limits() -> tuple[list[dict], float]:
        return matmul_limit(shapes, 2048, 2 * reps), attention_rate(config, lengths[-1], chunk, 2 * reps)

    # Measured before and after the prefills, best of both: other processes lower rates, never raise them.
    chunk = settings.max_num_batched_tokens
    limit_rows, attn_alone = limits()

    runs = []
    for n in lengths:
        times = []
        for _ in range(reps):
            p = prompt(n)
            start = time.perf_counter()
            engine.generate(p, ONE_TOKEN)
            times.append(time.perf_counter() - start)
        linear, attention = prefill_flops(config, n)
        prof = profile_prefill(engine, prompt(n))
        runs.append(
            {"n": n, "ttft": statistics.median(times), "best": min(times), "linear": linear, "attention": attention}
            | prof
        )

    again, attn_again = limits()
    limit_rows = [max(a, b, key=lambda r: r["gflops"]) for a, b in zip(limit_rows, again, strict=True)]
    limit = max(r["gflops"] for r in limit_rows)
    attn_alone = max(attn_alone, attn_again)

    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"] * 3
    lines = [
        f"Machine: {machine_description()}; Python {platform.python_version()}, torch {torch.__version__}; "
        f"model {loaded.model_id} in {str(loaded.dtype).removeprefix('torch.')}, {threads} threads, "
        f"prefill chunks of {settings.max_num_batched_tokens} tokens. Load average during the run: {' '.join(load)} "
        "(other processes shared the cores: absolute times are upper bounds).",
        "",
        f"### 1. The {dtype_name()} matmul limit ({threads} threads, {matmul_path()}, best of {4 * reps})",
        "",
        "| matmul | GFLOP/s |",
        "|---|---|",
        *[f"| {r['shape']} | {r['gflops']:.0f} |" for r in limit_rows],
        "",
        f"The limit used below is the best of these: {limit:.0f} GFLOP/s. Our attention kernel alone "
        f"(csrc/paged_attention.c, one layer of a {lengths[-1]}-token causal prefill in "
        f"{chunk}-token chunks, random data) reaches {attn_alone:.0f} GFLOP/s.",
        "",
        f"### 2. Cold prefill ({reps} runs) against that limit",
        "",
        "| prompt | TTFT (median) | TTFT (best) | linear GFLOP | attention GFLOP | GFLOP/s at best | of the limit |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rate = (r["linear"] + r["attention"]) / r["best"] / 1e9
        lines.append(
            f"| {r['n']} | {r['ttft']:.3f} s | {r['best']:.3f} s | {r['linear'] / 1e9:.0f} | "
            f"{r['attention'] / 1e9:.0f} | {rate:.0f} | {rate / limit:.0%} |"
        )
    lines += [
        "",
        "FLOPs: 2 per multiply-add; linears are every decoder-layer projection on every token plus the LM head on "
        "the last one; attention is q.k and p.v over the causal triangle (n(n+1)/2 pairs per head and layer).",
        "",
        "### 3. One cold prefill under torch.profiler, by kind of op (self time)",
        "",
        "| prompt | wall (profiled) | " + " | ".join(runs[0]["parts"]) + " |",
        "|---|---|" + "---|" * len(runs[0]["parts"]),
    ]
    for r in runs:
        cells = " | ".join(f"{s:.2f} s ({s / r['wall']:.0%})" for s in r["parts"].values())
        lines.append(f"| {r['n']} | {r['wall']:.2f} s | {cells} |")
    attn_rates = ", ".join(f"{r['n']}: {r['attention'] / max(r['parts']['attention'], 1e-9) / 1e9:.0f}" for r in runs)
    mm_rates = ", ".join(f"{r['n']}: {r['linear'] / max(r['parts']['matmuls'], 1e-9) / 1e9:.0f}" for r in runs)
    lines += [
        "",
        f"Rates inside the profile, GFLOP/s: attention kernel {attn_rates}; matmuls {mm_rates}. "
        "Attention is csrc/paged_attention.c (AMX tiles where the CPU has them, else AVX-512 bf16 dot products, "
        "else AVX2 + FMA); "
        "the fused ops are csrc/fused_ops.c.",
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("prefill_profile", "Cold prefill profile (bench/prefill_profile.py)", lines)


if __name__ == "__main__":
    main()
