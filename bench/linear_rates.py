"""The prompt rows' linears this CPU can run, side by side on SmolLM2's shapes: GFLOP/s per kernel.

Run: .venv/bin/python bench/linear_rates.py [--rows 512 2048] [--reps 5]

For each of a decoder layer's four linears (q/k/v, o, gate|up with SiLU·up, down) at a prefill's
row counts it times, interleaved in one run, every bf16 linear the kernel plan can pick here:
kvgate's AMX kernel (csrc/amx_linear.c, on AMX CPUs: row-invariant), oneDNN's packed matmul
(not row-invariant on AMX) and plain F.linear; and the plan's float32 path (torch's linear) where
the engine computes in float32. Each row of the table is one shape; "layer" sums the four by
time, which is what a prefill pays per layer. On a CPU without AMX the AMX column is absent:
this is the one command that measures the AMX path on a machine that has it.
Writes the linear-rates section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.cpu_threads import set_openmp_defaults

set_openmp_defaults()  # before torch is imported, as `kvgate` does

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.report import machine_description, write_section  # noqa: E402
from inference.amx_linear import PLAIN, SILU_MUL, AmxLinearKernel  # noqa: E402
from inference.platform import KernelSettings, onednn_has_bf16, plan_kernels, this_cpu  # noqa: E402
from inference.settings import EngineSettings  # noqa: E402

# SmolLM2-135M's linears per decoder layer: (name, out_features, in_features, fused SiLU·up).
SHAPES = [("qkv", 960, 576, False), ("o", 576, 576, False), ("gate_up", 3072, 576, True), ("down", 576, 1536, False)]


def best_seconds(fn: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        fn()
        best = min(best, (time.perf_counter() - start) / 2)
    return best


def kernels_for(weight: torch.Tensor, silu: bool, amx: AmxLinearKernel | None) -> dict[str, Callable]:
    """name -> f(x) for every linear the plan may run on this weight, each computing what the engine's does."""
    n = weight.shape[0]
    out: dict[str, Callable] = {}
    if amx is not None:
        packed = amx.pack(weight, pairs=silu)
        out["kvgate AMX"] = lambda x: amx.linear(x, packed, n, None, SILU_MUL if silu else PLAIN)
    if onednn_has_bf16(this_cpu()):
        reordered = torch.ops.mkldnn._reorder_linear_weight(weight)
        out["oneDNN packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, reordered, None, "none", [], "")
    out["F.linear bf16"] = lambda x: F.linear(x, weight)
    f32 = weight.float()
    out["F.linear float32"] = lambda x: F.linear(x.float(), f32)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    plan = plan_kernels(this_cpu(), device="cpu", dtype="auto", settings=KernelSettings(), fused_ops_version=2)
    amx = AmxLinearKernel.load(EngineSettings().cache_dir) if plan.prompt_linear == "amx" else None
    names: list[str] = []
    rows_out: list[str] = []
    for m in args.rows:
        totals: dict[str, float] = {}
        flops_total = 0
        for name, n, k, silu in SHAPES:
            gen = torch.Generator().manual_seed(n * k)
            weight = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
            kernels = kernels_for(weight, silu, amx)
            names = list(kernels)
            times = {kname: float("inf") for kname in kernels}
            for _ in range(3):  # interleaved rounds: a slow phase of the host hits every kernel alike
                for kname, fn in kernels.items():
                    fn(x)
                    times[kname] = min(times[kname], best_seconds(lambda fn=fn, x=x: fn(x), args.reps))
            flops = 2 * m * n * k
            flops_total += flops
            for kname, t in times.items():
                totals[kname] = totals.get(kname, 0.0) + t
            cells = " | ".join(f"{flops / times[kname] / 1e9:.0f}" for kname in names)
            rows_out.append(f"| {m} | {name} ({n}x{k}{', SiLU·up' if silu else ''}) | {cells} |")
            print(rows_out[-1], flush=True)
        cells = " | ".join(f"**{flops_total / totals[kname] / 1e9:.0f}**" for kname in names)
        rows_out.append(f"| {m} | layer (all four, by time) | {cells} |")
        print(rows_out[-1], flush=True)
    header = f"| rows | linear | {' | '.join(names)} |"
    lines = [
        f"Machine: {machine_description()}; torch {torch.__version__}, {threads} threads. GFLOP/s, best of "
        f"{args.reps} pairs of calls in each of 3 interleaved rounds. The engine's plan here: `{plan}`.",
        "",
        header,
        "|" + "---|" * (2 + len(names)),
        *rows_out,
        "",
        "The AMX kernel's sums for a row depend on that row alone (tests/inference/test_amx_linear.py); oneDNN's "
        "on AMX do not, which is why the plan runs the AMX kernel there and never oneDNN. For gate_up the AMX "
        "kernel also writes SiLU·up in its output stage; the other columns are the matmul alone. F.linear bf16 "
        "repacks its weight on every call; float32 is what the engine runs where it has no bf16 path.",
    ]
    write_section("linear_rates", "Prompt rows' linears on this CPU (bench/linear_rates.py)", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
