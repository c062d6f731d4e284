"""Decode speed of this checkout against another one, interleaved, for a loaded machine.

Run: .venv/bin/python bench/decode_ab.py --base /path/to/other/checkout [--rounds 5]
     .venv/bin/python bench/decode_ab.py --base . --this-env GOMP_SPINCOUNT=100000  (same code, two settings)
     .venv/bin/python bench/decode_ab.py --base . --base-env KVGATE_DECODE_LINEAR=onednn  (the decode kernels)

Two worker processes, one per checkout (each imports `inference` from its own tree),
each load SmolLM2-135M-Instruct once. The driver then asks them in turn for one
measurement at a time (A, B, B, A, ...), so both see the same load, and prints the
median tokens/s of each and their ratio per stream count. Each measurement: a fresh
batch of `streams` requests with 256-token prompts, greedy, ignore_eos, prefilled
first; the decode steps alone are timed (wall and process CPU time).
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, os, random, sys, time
from inference.cpu_threads import set_openmp_defaults
set_openmp_defaults()
import torch
from inference.engine import Engine
from inference.model_loader import load_model
from inference.settings import EngineSettings
from inference.types import CacheSpec, SamplingParams

loaded = load_model(EngineSettings())
engine = Engine(EngineSettings(kv_cache_gib=0.5), loaded=loaded)
rng = random.Random(4)
print("@@" + json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    streams, new_tokens = map(int, line.split())
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    for i in range(streams):
        prompt = [rng.randrange(100, 40000) for _ in range(256)]
        engine.add_request(f"r{time.monotonic_ns()}-{i}", prompt, params, CacheSpec())
    while engine.num_waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    wall, cpu, produced = time.perf_counter(), time.process_time(), 0
    while engine.has_unfinished():
        produced += sum(len(o.token_ids) for o in engine.step())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print("@@" + json.dumps({"tok_s": produced / wall, "cpu_ms_per_token": 1e3 * cpu / produced}), flush=True)
"""


def start(checkout: Path, extra_env: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(checkout), **dict(item.split("=", 1) for item in extra_env)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER],
        cwd=checkout,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert read(proc)["ready"]
    return proc


def read(proc: subprocess.Popen) -> dict:
    """The worker's next result line (its logging shares stdout and is skipped)."""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("a worker exited")
        if line.startswith("@@"):
            return json.loads(line[2:])


def measure(proc: subprocess.Popen, streams: int, new_tokens: int) -> dict:
    proc.stdin.write(f"{streams} {new_tokens}\n")
    proc.stdin.flush()
    return read(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--base-env", nargs="*", default=[], metavar="NAME=VALUE", help="extra environment, base")
    parser.add_argument("--this-env", nargs="*", default=[], metavar="NAME=VALUE", help="extra environment, this")
    args = parser.parse_args()
    this = Path(__file__).resolve().parent.parent
    procs = {"base": start(args.base.resolve(), args.base_env), "this": start(this, args.this_env)}
    results: dict[tuple[str, int], list[dict]] = {}
    load = [os.getloadavg()[0]]
    for streams in args.streams:
        for name in procs:  # warm-up, not counted
            measure(procs[name], streams, 8)
        for r in range(args.rounds):
            order = ("base", "this") if r % 2 == 0 else ("this", "base")
            for name in order:
                results.setdefault((name, streams), []).append(measure(procs[name], streams, args.tokens))
            load.append(os.getloadavg()[0])
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    for streams in args.streams:
        pairs = zip(results[("base", streams)], results[("this", streams)], strict=True)
        print(
            f"{streams} stream(s), tok/s per round (base, this):",
            [(round(x["tok_s"], 1), round(y["tok_s"], 1)) for x, y in pairs],
        )
    print(f"load average (1 min) during the run: {min(load):.1f} to {max(load):.1f}")
    print("| streams | base tok/s | this tok/s | this/base | base CPU ms/token | this CPU ms/token |")
    print("|---|---|---|---|---|---|")
    for streams in args.streams:
        b = [m["tok_s"] for m in results[("base", streams)]]
        t = [m["tok_s"] for m in results[("this", streams)]]
        ratios = [x / y for x, y in zip(t, b, strict=True)]  # pairwise: each pair ran back to back
        bc = statistics.median(m["cpu_ms_per_token"] for m in results[("base", streams)])
        tc = statistics.median(m["cpu_ms_per_token"] for m in results[("this", streams)])
        print(
            f"| {streams} | {statistics.median(b):.1f} | {statistics.median(t):.1f} "
            f"| {statistics.median(ratios):.2f} | {bc:.1f} | {tc:.1f} |"
        )


if __name__ == "__main__":
    main()
