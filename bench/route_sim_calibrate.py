"""`bench/route_sim.py --calibrate`: time the real engine, fit the simulator's cost model, write the JSON.

On the real SmolLM2 engine (inference.engine.Engine, as bench/engine.py runs it, with
kvgate's OpenMP wait policy), one token out each:
- cold prefills at a few prompt lengths, and extensions of a cached prompt (the cached
  part read, the rest computed): a least-squares fit of t = a + b·uncached + c·cached;
- a prompt read back from the host tier vs from the device pool: h per token copied up;
- decode with 8 streams: d, seconds per token per stream.
Each time is the fastest of 3 runs: on shared cores the fastest is the least disturbed. The file
names the machine and its load average, since the cores may be shared.
"""

from __future__ import annotations

import json
import os
import platform
import random
import time
from pathlib import Path

LENGTHS = (256, 1024, 2048)
EXTENSION = 128  # new tokens after a cached prompt


def calibrate(path: Path, reps: int = 3) -> dict:
    # Imported here: the simulator itself never loads torch.
    import numpy as np

    from bench.engine import ONE_TOKEN, bench_decode, engine_on, timed, tokens
    from bench.report import machine_description
    from inference.model_loader import load_model
    from inference.settings import EngineSettings

    load_before = os.getloadavg()[0]
    loaded = load_model(EngineSettings())
    engine = engine_on(loaded)
    rng = random.Random(11)
    engine.generate(tokens(rng, 64), ONE_TOKEN)  # warm up allocator and kernels
    rows: list[tuple[int, int, float]] = []  # (uncached, cached, fastest seconds)
    for n in LENGTHS:
        cold, warm, cached = [], [], 0
        for _ in range(reps):
            prompt = tokens(rng, n)
            cold.append(timed(lambda p=prompt: engine.generate(p, ONE_TOKEN)))
            longer = prompt + tokens(rng, EXTENSION)
            start = time.perf_counter()
            out = engine.generate(longer, ONE_TOKEN)
            warm.append(time.perf_counter() - start)
            cached = out.usage.cached_tokens
        rows += [(n, 0, min(cold)), (n + EXTENSION - cached, cached, min(warm))]
    x = np.array([[1.0, u, c] for u, c, _ in rows])
    y = np.array([t for _, _, t in rows])
    a, b, c = (max(float(v), 0.0) for v in np.linalg.lstsq(x, y, rcond=None)[0])

    # Host tier: a 1024-token prompt pushed out of a small pool by a bigger one, then read back.
    small = engine_on(loaded, kv_cache_blocks=200, kv_host_blocks=1024)
    small.generate(tokens(rng, 64), ONE_TOKEN)
    host_s, device_s, host_tokens = [], [], 0
    for _ in range(reps):
        prompt = tokens(rng, 1024)
        small.generate(prompt, ONE_TOKEN)
        device_s.append(timed(lambda p=prompt: small.generate(p, ONE_TOKEN)))
        small.generate(tokens(rng, 3000), ONE_TOKEN)  # evicts the first prompt's blocks to the host tier
        start = time.perf_counter()
        out = small.generate(prompt, ONE_TOKEN)
        host_s.append(time.perf_counter() - start)
        host_tokens = out.usage.cached_tokens_by_tier.get("host", 0)
    h = max(min(host_s) - min(device_s), 0.0) / host_tokens if host_tokens else 0.0

    streams = 8
    d = streams / bench_decode(loaded, streams, 64)
    pool_blocks = engine.pool.num_blocks
    data = {
        "machine": machine_description(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
        "model": loaded.model_id,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device_pool_blocks_at_1_gib": pool_blocks,
        "fit": {"a": a, "b": b, "c": c, "h": h, "d": d},
        "method": f"fastest of {reps} runs per sample; host read after a 3000-token evicting prompt",
        "fit_means": "prefill s = a + b·uncached + c·cached + h·host-tier tokens; decode s/token/stream = d "
        f"(at {streams} streams)",
        "samples": {
            "prefill": [{"uncached": u, "cached": c_, "s": round(t, 4)} for u, c_, t in rows],
            "host_read": {"tokens": host_tokens, "host_s": host_s, "device_s": device_s},
        },
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps({k: data[k] for k in ("machine", "load_average", "fit")}, indent=2))
    return data
