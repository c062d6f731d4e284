"""A two-tool agent task run through pydantic-ai and openai-agents, unmodified, against `kvgate serve`:
how many runs out of N each framework finishes on a bundled model (the yardstick for choosing a tool model).

Run: .venv/bin/python bench/agent_tasks.py [--model Qwen2.5-Coder-0.5B-Instruct] [--runs 10] [--no-write]

The task: "What is the weather in Paris, in degrees Fahrenheit?" with two tools,
get_weather(city) -> {"city", "celsius": 18} and to_fahrenheit(celsius) -> 64.4. A run
finishes when the agent called get_weather for Paris, then to_fahrenheit with 18, and its
final answer says 64. Runs sample at temperature 0.7 with seeds 0..N-1 (greedy would make
every run the same run). A run that raises (turn limit, a malformed call) does not finish.
Prints a table and rewrites the agent-tasks section of docs/benchmarks.md. Not a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import machine_description, write_section

ADMIN = "bench-admin-token-0123"
QUESTION = "What is the weather in Paris, in degrees Fahrenheit?"
INSTRUCTIONS = "Use the tools. Get the weather first, then convert its temperature."


class Trace:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def get_weather(self, city: str) -> dict[str, Any]:
        """The current weather in a city, in degrees Celsius."""
        self.calls.append(("get_weather", city))
        return {"city": city, "celsius": 18}

    def to_fahrenheit(self, celsius: float) -> float:
        """Degrees Celsius in degrees Fahrenheit."""
        self.calls.append(("to_fahrenheit", celsius))
        return round(celsius * 9 / 5 + 32, 1)

    def finished(self, answer: object) -> bool:
        weather = [a for n, a in self.calls if n == "get_weather"]
        converted = [a for n, a in self.calls if n == "to_fahrenheit"]
        return (
            bool(weather)
            and str(weather[0]).lower() == "paris"
            and any(abs(float(c) - 18) < 1e-6 for c in converted)
            and "64" in str(answer)
        )


def pydantic_ai_run(base_url: str, key: str, model_id: str, seed: int) -> bool:
    from pydantic_ai import Agent, ModelSettings
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    trace = Trace()
    model = OpenAIChatModel(model_id, provider=OpenAIProvider(base_url=base_url, api_key=key))
    agent = Agent(
        model,
        system_prompt=INSTRUCTIONS,
        model_settings=ModelSettings(temperature=0.7, seed=seed, max_tokens=160),
        tools=[trace.get_weather, trace.to_fahrenheit],
    )
    try:
        result = agent.run_sync(QUESTION)
    except Exception:
        return False
    return trace.finished(result.output)


def openai_agents_run(base_url: str, key: str, model_id: str, seed: int) -> bool:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    trace = Trace()
    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
    agent = Agent(
        name="weather",
        instructions=INSTRUCTIONS,
        tools=[function_tool(trace.get_weather), function_tool(trace.to_fahrenheit)],
        model=OpenAIChatCompletionsModel(model=model_id, openai_client=client),
        model_settings=ModelSettings(temperature=0.7, max_tokens=160, extra_args={"seed": seed}),
    )
    try:
        result = Runner.run_sync(agent, QUESTION, run_config=RunConfig(tracing_disabled=True), max_turns=6)
    except Exception:
        return False
    return trace.finished(result.final_output)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "KVGATE_MODEL": model,
        "KVGATE_DATABASE_URL": f"sqlite:///{workdir / 'kvgate.db'}",
        "KVGATE_ADMIN_TOKEN": ADMIN,
        "KVGATE_SPOOL_PATH": str(workdir / "spool.jsonl"),
        "KVGATE_INFLIGHT_JOURNAL_DIR": str(workdir / "inflight"),
    }
    log = (workdir / "serve.log").open("ab")
    kvgate = Path(sys.executable).with_name("kvgate")
    process = subprocess.Popen([str(kvgate), "serve", "--port", str(port)], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                return process, base
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("kvgate serve did not come up: see " + str(workdir / "serve.log"))
        time.sleep(0.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kvgate-agents-") as tmp:
        process, base = serve(args.model, Path(tmp))
        try:
            admin = httpx.Client(base_url=base, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60)
            model_id = admin.get("/healthz").json()["model"]
            tenant = admin.post("/admin/v1/tenants", json={"name": "bench"}).json()["id"]
            key = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "b"}).json()["key"]
            rows = []
            for name, run in (("pydantic-ai 2.68", pydantic_ai_run), ("openai-agents 0.24", openai_agents_run)):
                started = time.perf_counter()
                finished = sum(run(base + "/v1", key, model_id, seed) for seed in range(args.runs))
                rows.append((name, finished, (time.perf_counter() - started) / args.runs))
                print(f"{name}: {finished}/{args.runs}", flush=True)
        finally:
            process.terminate()
            process.wait(timeout=60)
    lines = [
        f"Machine: {machine_description()}; Python {platform.python_version()}. `kvgate serve` with "
        f"KVGATE_MODEL={args.model}, default settings; {args.runs} runs per framework, temperature 0.7, seeds "
        f"0..{args.runs - 1}.",
        "",
        f"Task: {QUESTION!r} with get_weather(city) and to_fahrenheit(celsius); a run finishes when both tools "
        "were called right and the answer says 64.",
        "",
        "| framework | runs finished | seconds per run |",
        "|---|---|---|",
        *(f"| {name} | {done}/{args.runs} | {seconds:.1f} |" for name, done, seconds in rows),
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section(
            "agent_tasks", "A two-tool agent task through pydantic-ai and openai-agents (bench/agent_tasks.py)", lines
        )


if __name__ == "__main__":
    main()
