"""Cold prefill (or decode) of two checkouts of kvgate, interleaved on the same prompts: a ratio a busy machine keeps.

Run: .venv/bin/python bench/prefill_ab.py --base /path/to/other/checkout [--lengths 512,1024,2048,4096] [--reps 4]
 e.g. after `git worktree add /tmp/kvgate-base <commit>`.
Each checkout runs in its own worker process (its code first on the path), both load the
model once; then each prompt goes to one and then the other, alternating which goes first.
Reports medians, the median of the per-prompt new/base ratios, and the ratio of the CPU time
the workers spent (less sensitive than wall time to other processes taking the cores).
Prints only; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def worker() -> None:
    sys.path.insert(0, os.getcwd())
    from inference.cpu_threads import set_openmp_defaults

    set_openmp_defaults()
    from inference.engine import Engine
    from inference.model_loader import load_model
    from inference.settings import EngineSettings
    from inference.types import SamplingParams

    engine = Engine(EngineSettings(kv_cache_gib=1.0), loaded=load_model(EngineSettings()))
    engine.generate([random.Random(0).randrange(100, 40000) for _ in range(64)], SamplingParams(max_tokens=1))
    print("ready", flush=True)
    for line in sys.stdin:
        kind, n, seed = line.split()
        rng = random.Random(int(seed))
        prompt = [rng.randrange(100, 40000) for _ in range(int(n))]
        new_tokens = 1 if kind == "cold" else 64
        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        cpu, wall = time.process_time(), time.perf_counter()
        engine.generate(prompt, params)
        print(time.perf_counter() - wall, time.process_time() - cpu, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the other checkout (the baseline)")
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--kind", choices=["cold", "decode"], default="cold", help="decode: 64 new tokens")
    args = parser.parse_args()
    trees = {"base": Path(args.base).resolve(), "new": HERE}
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(HERE / "bench" / "prefill_ab.py"), "--worker"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for name, tree in trees.items()
    }
    for proc in procs.values():
        while proc.stdout.readline().strip() != "ready":
            pass
    lengths = [int(x) for x in args.lengths.split(",")]
    wall = {(n, k): [] for n in lengths for k in trees}
    cpu = {(n, k): [] for n in lengths for k in trees}
    loads = []
    seed = 1000
    for rep in range(args.reps):
        for n in lengths:
            seed += 1
            for name in list(trees) if rep % 2 == 0 else list(trees)[::-1]:
                procs[name].stdin.write(f"{args.kind} {n} {seed}\n")
                procs[name].stdin.flush()
                w, c = procs[name].stdout.readline().split()
                wall[(n, name)].append(float(w))
                cpu[(n, name)].append(float(c))
            loads.append(os.getloadavg()[0])
    print(f"| {args.kind}, prompt | base | new | new/base (median of pairs) | CPU time new/base |")
    print("|---|---|---|---|---|")
    for n in lengths:
        b, w = wall[(n, "base")], wall[(n, "new")]
        pairs = statistics.median(y / x for x, y in zip(b, w, strict=True))
        cpu_ratio = statistics.median(cpu[(n, "new")]) / statistics.median(cpu[(n, "base")])
        print(f"| {n} | {statistics.median(b):.3f} s | {statistics.median(w):.3f} s | {pairs:.2f} | {cpu_ratio:.2f} |")
    print(f"load average (1 min) during the run: {min(loads):.1f} to {max(loads):.1f}")
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()
